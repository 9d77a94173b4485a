"""zoo.load: any checkpoint zoo reads -> one Pretrained (model, params, tokenizer, config).

Which kind `source` is, is decided from the path alone, before anything is read or built:

    a zoo run directory (checkpoints/)   its newest step that restores and verifies (`step`: that one);
                                         a LoRA run's adapters merged into its base (zoo.training.runs)
    a Hugging Face directory             converted in memory, nothing written (zoo.hf.convert.from_pretrained)
    (config.json + weights)
    a PEFT adapter directory             its base (`base`, else adapter_config.json's base_model_name_or_path:
    (adapter_config.json)                any of these kinds itself) with the adapter merged, in memory
    a .gguf file                         converted once, as `zoo-convert from-gguf` converts it, into a run in
                                         zoo's cache (zoo.runtime: ~/.cache/zoo/converted/), reused after
    a preset name (zoo.models.PRESETS)   fresh weights from `seed`, the byte tokenizer

`dtype` ("bfloat16", "float16", "float32") casts the floating params and computes in it; `mesh` (a
jax.sharding.Mesh with zoo's axes) lays the params out by zoo's rules table (zoo.training.sharding; read on the host
first, then put on the devices).
"""

from __future__ import annotations

import dataclasses
import json
import os

from zoo.errors import ArgumentError, CheckpointError
from zoo.sources import Source, kind_of

DTYPES = ("float32", "bfloat16", "float16")
MESH_AXES = ("data", "fsdp", "tensor", "expert")  # zoo.training.sharding.AXES (not imported: it imports jax)


def check(source, dtype, step, base, mesh) -> str:
    """The arguments of `load`, checked before anything is read; returns the source's kind."""
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    if not isinstance(source, str) or not source:
        raise ArgumentError(f"source={source!r}: give a path or a preset name as a string")
    if dtype is not None and str(getattr(dtype, "name", dtype)) not in DTYPES:
        raise ArgumentError(f"dtype={dtype!r}; choose one of {', '.join(DTYPES)} (or None: as saved)")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise ArgumentError(f"step={step!r} must be a checkpoint's step number (an int >= 0)")
    if mesh is not None and set(getattr(mesh, "axis_names", ())) != set(MESH_AXES):
        raise ArgumentError(f"mesh={mesh!r}: give a jax.sharding.Mesh with zoo's axes {', '.join(MESH_AXES)} "
                            f"(zoo.training.sharding.make_mesh(zoo.configuration.MeshConfig(fsdp=...)) makes one)")
    kind = kind_of(source)
    if step is not None and kind != "run":
        raise ArgumentError(f"step={step} picks a checkpoint of a zoo run; {source!r} is not one")
    if base is not None and kind != "adapter":
        raise ArgumentError(f"base={base!r} is the base of a PEFT adapter directory; {source!r} is not one")
    return kind


def load(source, *, dtype=None, step: int | None = None, base: str | None = None, mesh=None, seed: int = 0):
    """The model in `source`, as a zoo.Pretrained (model, params, tokenizer, config and the calls of its family).

    source: a zoo run directory (its newest step that restores and verifies, or `step`; a LoRA run's adapters
    merged into its base), a Hugging Face directory (converted in memory), a PEFT adapter directory (on `base`,
    default its adapter_config.json's base_model_name_or_path; merged in memory), a .gguf file (converted once
    into zoo's cache, ~/.cache/zoo or $ZOO_CACHE_DIR, as `zoo-convert from-gguf` converts it, read from there after),
    or a preset name (zoo.models.PRESETS: fresh weights from `seed`, the byte tokenizer).
    dtype: "bfloat16", "float16" or "float32": params cast to it and computed in it (None: as saved).
    mesh: a jax.sharding.Mesh with zoo's axes (data, fsdp, tensor, expert; zoo.training.sharding.make_mesh): the
    params laid out over it by zoo's rules table, as the trainer lays them out.
    Raises zoo.errors.CheckpointError (a missing path, a directory of no kind zoo reads, damage in every step),
    ArgumentError (a bad dtype, base or mesh; a step the run does not hold) before any weights are read.
    """
    from zoo.api.pretrained import Pretrained
    from zoo.runtime import use_compile_cache
    kind = check(source, dtype, step, base, mesh)
    use_compile_cache()
    source = os.path.expanduser(os.fspath(source))
    run_dir, lora_run = None, None
    if kind == "run":
        cfg, params, step = _run(source, step)
        run_dir, lora_run = source, source if cfg.model.lora_spec is not None else None
    elif kind == "gguf":
        from zoo.hf.gguf import cached_run
        run_dir = cached_run(Source(source, kind))
        cfg, params, step = _run(run_dir, None)
    elif kind == "hf":
        from zoo.hf.convert import from_pretrained
        _, params, tok, cfg = from_pretrained(source)
    elif kind == "adapter":
        cfg, params, base_lm = _adapter(source, base)
        run_dir = base_lm.run_dir
    else:
        cfg, params = _preset(source, seed)
    from zoo.data.tokenizers import get_tokenizer
    tok = tok if kind == "hf" else get_tokenizer(cfg.data.tokenizer)
    cfg = plain(cfg)
    if dtype is not None:
        cfg, params = _cast(cfg, params, str(getattr(dtype, "name", dtype)))
    import jax
    # On the device once, here: host (numpy) params would be copied to the device again by every jitted call
    # (all-MiniLM-L6-v2's 90 MB: 45 of a batch-1 embed's 51 ms on this CPU).
    params = jax.device_put(params) if mesh is None else _laid_out(cfg, params, mesh)
    from zoo import tasks
    return Pretrained(tasks.build(cfg).model, params, tok, cfg, source=source, kind=kind, step=step, run_dir=run_dir,
                      lora_run=lora_run)


def _run(path: str, step):
    from zoo.training import checkpoint, runs
    if step is not None and step not in (steps := checkpoint.all_steps(path)):
        listed = ", ".join(map(str, steps[:8])) + (", ..." if len(steps) > 8 else "")
        raise ArgumentError(f"step={step}: {path!r} has no checkpoint of that step; its steps (newest first): "
                            f"{listed or 'none'}")
    step, cfg, params = runs.load_weights(path, step=step)
    return cfg, params, step


def plain(cfg):
    """The config of the plain model a loaded run's merged params fit: no adapters, no quantized base, nothing
    frozen (a LoRA run's model.lora_rank would describe params it no longer has)."""
    from zoo.models.base import ModelConfig
    defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig) if f.name.startswith(("lora_", "quantize"))}
    model = dataclasses.replace(cfg.model, **defaults)
    return dataclasses.replace(cfg, model=model, train=dataclasses.replace(cfg.train, trainable=""))


def _adapter(path: str, base: str | None):
    """(config, merged params, the base's Pretrained) of a PEFT adapter on its base, in memory."""
    from zoo.hf import io, peft
    from zoo.nn import lora
    from zoo.training import freeze
    c = peft.read_config(path)
    src = base or c.get("base_model_name_or_path")
    if not isinstance(src, str) or not (os.path.exists(os.path.expanduser(src)) or _is_preset(src)):
        raise CheckpointError(f"the adapter's base_model_name_or_path={json.dumps(src)} is not here; give its base "
                              f"with base= (a zoo run, a Hugging Face directory or a .gguf file)")
    base_lm = load(src)
    lora_cfg, adapters = peft._plan(c, io.read_tensors(path), base_lm.config, base_lm.run_dir or src,
                                    os.path.join(path, peft.WEIGHTS))
    merged = lora.merge(freeze.unflat({**freeze.flat(base_lm.params), **adapters}), lora_cfg.model.lora_spec)
    return base_lm.config, merged, base_lm


def _is_preset(name: str) -> bool:
    from zoo.models import PRESETS
    return name in PRESETS


def _preset(name: str, seed: int):
    """(config, fresh params) of a preset: the family's first task, the byte tokenizer, its own positions."""
    import flax.linen as nn
    import jax
    from zoo import tasks
    from zoo.configuration import Config, DataConfig
    from zoo.models import FAMILIES, PRESETS
    model = PRESETS[name]
    family = FAMILIES[model.family]
    if model.vocab_size < 257:
        raise ArgumentError(f"preset {name!r} has {model.vocab_size} ids, fewer than the byte tokenizer's 257")
    seq_len = min(getattr(model, "max_len", 512), 512)
    cfg = Config(task=family.default_task, model=model, data=DataConfig(tokenizer="bytes", seq_len=seq_len))
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ArgumentError(f"seed={seed!r} must be an int >= 0")
    params = jax.jit(lambda r: nn.unbox(tasks.build(cfg).init(r)))(jax.random.PRNGKey(seed))
    return cfg, params


def _cast(cfg, params, dtype: str):
    import jax
    import jax.numpy as jnp
    model = dataclasses.replace(cfg.model, dtype=dtype, param_dtype=dtype)
    cast = jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, params)
    return dataclasses.replace(cfg, model=model), cast


def _laid_out(cfg, params, mesh):
    """`params` over `mesh` as the trainer lays them out (logical axes -> mesh axes, zoo.training.sharding)."""
    import jax
    from zoo import tasks
    from zoo.training import sharding
    boxed = jax.eval_shape(tasks.build(cfg).init, jax.random.PRNGKey(0))
    return jax.device_put(params, sharding.shardings(boxed, mesh))
