"""What a zoo benchmark worker reports about the model it set up, and how it applies the spec to the config:
the speed-deciding settings, framework versions and attention fallbacks, the compute dtype, a `preset=`
override, one device's peak memory. Shared by zoo.bench.worker and zoo.bench.eval_speed."""

from __future__ import annotations

import contextlib
import tempfile

from zoo.training.memory import peak_memory_mb


def settings(model_cfg) -> dict:
    """The model switches that decide speed, as run: dtype, attention backend (auto on GPU: cudnn, with XLA
    where the shapes refuse it, see `attention_fallbacks` in the ready report), remat, layer scan."""
    from zoo.nn.attention import resolve_attention
    out = {"dtype": model_cfg.dtype, "attention": resolve_attention(model_cfg.attention_impl),
           "remat": getattr(model_cfg, "remat_policy", "full") if getattr(model_cfg, "remat", False) else "none",
           "scan_layers": getattr(model_cfg, "scan_layers", False)}
    if getattr(model_cfg, "lora_rank", 0):  # adapters on a frozen base
        out["lora"] = {"rank": model_cfg.lora_rank, "alpha": model_cfg.lora_alpha, "targets": model_cfg.lora_targets,
                       "quantize_base": model_cfg.quantize_base}
    return out


def versions_and_fallbacks() -> dict:
    """zoo's framework versions, the XLA flags it ran with (zoo's GPU flags included, zoo.accel), and why
    `auto` attention ran XLA instead of cuDNN (if it did)."""
    import os

    import flax
    import jax
    from zoo.nn.attention import FALLBACKS
    out = {"zoo": f"jax {jax.__version__} / flax {flax.__version__}", "xla_flags": os.environ.get("XLA_FLAGS", "")}
    if FALLBACKS:
        out["attention_fallbacks"] = sorted(FALLBACKS)
    return out


def compute_dtype(spec, jax) -> str:
    """The bench's dtype: the spec's, else float32 on CPU and bfloat16 on accelerators."""
    return spec.get("dtype") or ("float32" if jax.devices()[0].platform == "cpu" else "bfloat16")


def apply_preset(cfg, spec):
    """cfg with the model of the spec's `preset=` override (its dtype, no dropout, the LoRA settings kept)."""
    import dataclasses
    from zoo.models import PRESETS
    for o in spec["overrides"]:
        if o.startswith("preset="):
            name = o.split("=", 1)[1]
            if name not in PRESETS:
                raise ValueError(f"--preset {name!r} is unknown; choose one of {', '.join(sorted(PRESETS))}")
            keep = {f: getattr(cfg.model, f) for f in ("lora_rank", "lora_alpha", "lora_dropout", "lora_targets",
                                                       "quantize_base")}
            model = dataclasses.replace(PRESETS[name], dtype=cfg.model.dtype, dropout=0.0, **keep)  # LoRA stays
            cfg = dataclasses.replace(cfg, model=model)
    return cfg


def device_peak_memory_mb(device) -> float:
    """The peak memory of one device (zoo.training.memory.peak_memory_mb)."""
    return peak_memory_mb([device])


@contextlib.contextmanager
def frozen_base(cfg):
    """cfg as the benchmark runs it: a LoRA config without init_from gets, in a temporary directory removed
    on leaving, a weights-only checkpoint of its plain model (random params, no adapters) as init_from."""
    import dataclasses
    import flax.linen as nn
    import jax
    from zoo import tasks
    from zoo.training import checkpoint
    if cfg.model.lora_spec is None or cfg.init_from:
        yield cfg
        return
    base = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, lora_rank=0))  # its config: no adapters
    with tempfile.TemporaryDirectory(prefix="zoo-bench-base-") as path:
        params = jax.jit(lambda r: nn.unbox(tasks.plain(base).init(r)))(jax.random.PRNGKey(1))
        checkpoint.save_weights(path, params, base)
        del params
        yield dataclasses.replace(cfg, init_from=path)
