"""A run's train step compiled for a target it is not running on (`train.py CONFIG --compile-for TARGET`,
`zoo.compile_for(...)`): the trainer's own setup (task, mesh from `mesh.*`, optimizer, LoRA/QLoRA, shardings) on
the target's compile-only devices, the state as abstract arrays laid out as the run would lay them out, one batch
shaped as the run's data pipeline makes it, then `jit(train_step).lower(...).compile()` and the report
(zoo.aot.report). Nothing is trained, no checkpoint or workdir is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import time

import numpy as np

from zoo.aot import report, target as targets
from zoo.configuration import Config
from zoo.overrides import apply_overrides
from zoo.errors import ConfigError


# Pretraining tasks, whose batches are [train.batch_size, data.seq_len] windows of any corpus: their batch is shaped
# from the built-in corpus and byte tokens, so a config whose corpus or tokenizer needs a download (gpt2_small's
# openwebtext) compiles offline. Every other task's batch comes from its own data (its columns shape it).
SHAPE_ONLY = ("gpt_lm", "bert_mlm")


def _abstract_batch(s, cfg: Config) -> dict:
    """One global batch as ShapeDtypeStructs laid out over the data axes, shaped by the task's own pipeline."""
    import jax
    from zoo.training import sharding
    if hasattr(s.task, "rollout"):
        raise ConfigError(f"--compile-for: task={cfg.task} samples its batches inside the run (rollouts); compile "
                          f"its policy as task=sft, or its generation with zoo-serve --compile-for")
    if cfg.task in SHAPE_ONLY:  # the corpus and tokenizer do not shape the batch: the built-in one will do
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, source="builtin", tokenizer="bytes"))
    with contextlib.redirect_stdout(io.StringIO()):  # the data's own counts are said by a real run
        train = s.task.make_data(cfg, 0, 1).train
        local = train.shaped(0) if hasattr(train, "shaped") else train(0)  # distill.top_k: no cache built to compile
    sh = sharding.batch_sharding(s.mesh)
    return {k: jax.ShapeDtypeStruct(np.shape(v), np.asarray(v).dtype, sharding=sh) for k, v in local.items()}


def compile_step(cfg: Config, devices) -> tuple[dict, float]:
    """(the report's figures that do not depend on the chip table, compile seconds) of cfg's train step."""
    from zoo.training import freeze, sharding, trainer
    s = trainer.setup(cfg, devices, abstract_base=True)
    batch = _abstract_batch(s, cfg)
    st = s.abstract_state
    fixed = {"params": report.bytes_per_device((st.params, st.frozen)), "optimizer": report.bytes_per_device(st.opt_state)}
    rows, length = next(iter(batch.values())).shape[:2]
    fpt = freeze.flops_per_token(s.task, cfg.data.seq_len, s.abstract_params, s.trainable)
    if "target_len" in inspect.signature(s.task.flops_per_token).parameters:  # seq2seq: per source + target token
        length = 2 * cfg.data.seq_len
    fig = {"program": f"train step of task={cfg.task} (train.batch_size={cfg.train.batch_size}, "
                      f"data.seq_len={cfg.data.seq_len}, grad_accum={cfg.train.grad_accum})",
           "mesh": dict(s.mesh.shape), "model_flops": float(fpt * rows * length),
           "loop_trips": cfg.train.grad_accum}  # XLA's cost analysis counts the microbatch loop's body once
    t0 = time.perf_counter()
    with sharding.kernels_mesh(s.mesh):  # traced under the target's mesh, as the trainer traces it on a TPU
        out = report.compiled(lambda: s.jit_train_step().lower(st, batch).compile(), fixed)
    return {**fig, **out}, time.perf_counter() - t0


def finish(fig: dict, seconds: float, t: targets.Target, n_devices: int) -> dict:
    """The figures of one compiled program set against the target's chip: fits, the roofline estimate."""
    chip = t.chip
    hbm = chip.hbm_bytes * t.chips / n_devices  # a v4 device is one of a chip's two TensorCores
    est = None
    if fig["flops_per_device"] is not None:  # compiled (XLA refuses a program whose temporaries exceed HBM)
        trips = fig.get("loop_trips", 1)  # the loop's body counted as often as it runs (its rest over-counted)
        # A scanned layer stack is a loop XLA also counts once: the compute bound takes zoo's own count where
        # it is the larger, so the estimate never credits a step with less work than the model does.
        flops = max(fig["flops_per_device"] * trips, fig["model_flops"] / n_devices)
        est = report.roofline(flops, fig["bytes_accessed_per_device"] * trips, sum(fig["collective_bytes"].values()),
                              chip)
        est["mfu"] = fig["model_flops"] / (est["step_s"] * chip.bf16_flops * t.chips) if est["step_s"] else 0.0
    return {"target": t.name, "topology": t.topology, "slices": t.slices, "chips": t.chips, "devices": n_devices,
            "chip": dataclasses.asdict(chip), "hbm_per_device": hbm, **fig, "compile_seconds": seconds,
            "fits": est is not None and fig["bytes_per_device"]["total"] <= hbm, "estimate": est}


def compile_for(config=None, target: str = "v5e:2x2", *, overrides=(), init_from: str | None = None,
                largest_batch: bool = False, program: str = "train", **generate) -> dict:
    """The report of a run's train step compiled for `target` ("v5e:2x2", "v5p-16", "v5e-8/2": see
    zoo.aot.target), the run given as zoo.train takes it (a config file or name, a Config, overrides, init_from;
    resolved as a dry run: nothing converted or written). The report: bytes per device (params, optimizer
    state, temporaries, total) beside the chip's HBM and `fits`; FLOPs per step from XLA beside zoo's model
    count; bytes of each kind of collective; the custom-call kernels; compile seconds; a roofline estimate of
    the step time and MFU. `largest_batch`: also the largest train.batch_size that fits (each size compiled).

    program="generate": instead, the program `zoo.load(config).generate` runs (config: a preset name or a zoo
    run), for `rows`, `prompt_len`, `max_new_tokens` and `dtype` given as keywords (zoo.aot.decode).
    program="serve": zoo-serve's engine (its decode chunk and prefill) for `slots`, `max_len`, `chunk`, `dtype`,
    `paged_kernel` ("auto", "off" or "tpu": jax's paged-attention kernel) and `scan_layers` (zoo.aot.serve)."""
    if program == "generate":
        from zoo.aot import decode
        return decode.compile_generate(config, target, **generate)
    if program == "serve":
        from zoo.aot import serve
        return serve.compile_serve(config, target, **generate)
    if program != "train" or generate:
        raise ConfigError(f"program={program!r}{' with ' + ', '.join(generate) if generate else ''}: compile_for "
                          f"compiles program='train' (a run's step), 'generate' (rows, prompt_len, "
                          f"max_new_tokens, dtype) or 'serve' (slots, max_len, chunk, dtype)")
    if not isinstance(config, Config) or overrides or init_from:
        from zoo.api.start import start
        from zoo.api.training import default_workdir
        config = start(config, workdir=default_workdir(config, init_from), overrides=overrides, init_from=init_from,
                       dry=True).config
    return _compile_for(config, target, largest_batch)


def _compile_for(cfg: Config, target: str, largest_batch: bool) -> dict:
    t = targets.parse(target)
    devices = targets.devices(t)
    fig, seconds = compile_step(cfg, devices)
    out = finish(fig, seconds, t, len(devices))
    if largest_batch:
        out["largest_batch"] = _largest_batch(cfg, devices, out)
    return out


def _largest_batch(cfg: Config, devices, first: dict) -> int | None:
    """Doubling from the smallest batch the mesh takes until one does not fit, then halving back between."""
    dp = first["mesh"]["data"] * first["mesh"]["fsdp"] * first["mesh"]["expert"]
    unit = dp * cfg.train.grad_accum

    def fits(b: int) -> bool:
        c = apply_overrides(cfg, [f"train.batch_size={b}"])
        fig, _ = compile_step(c, devices)
        return fig["bytes_per_device"]["total"] <= first["hbm_per_device"]
    lo, hi = 0, unit
    while fits(hi):
        lo, hi = hi, hi * 2
        if hi > 1 << 16:
            return lo
    while hi - lo > unit:
        mid = (lo + hi) // 2 // unit * unit
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo or None
