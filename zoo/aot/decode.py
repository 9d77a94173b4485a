"""Generation compiled for a target (`zoo.compile_for(..., program="generate")`, `zoo-sample SOURCE --compile-for`):
the program `zoo.load(SOURCE).generate` runs (zoo.infer.sample: prefill of the prompt rows into a KV cache, then a
while loop of one-token decode steps), built for `rows` prompts of `prompt_len` tokens and `max_new_tokens` new ones,
its layers as one scan as generation runs them, the params abstract (nothing is loaded or initialised: a 7B
preset costs no memory here) and laid out over the target's chips with the trainer's rules on a tensor-parallel
mesh (heads, MLP width and vocabulary split over every chip; `mesh` to choose another).

Decoding a token reads every weight and the whole KV cache once, so the estimate per new token is
(params + KV cache bytes per device) / HBM bandwidth, the bound a decode step meets at best; the prefill's is its
FLOPs at the chips' peak.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from zoo.aot import report, target as targets
from zoo.configuration import MeshConfig
from zoo.errors import ConfigError


def _config(source: str, dtype: str, scan: bool = True):
    """The model config of a preset name or a zoo run, cast to `dtype` and scanned, as generation runs it (`scan`
    False: its layers one after another, as zoo-serve's engine runs them)."""
    import os
    from zoo.models import PRESETS
    if source in PRESETS:
        model = PRESETS[source]
    elif os.path.isdir(source):
        from zoo.api.load import plain
        from zoo.training import runs
        model = plain(runs.load_config(source)).model
    else:
        raise ConfigError(f"--compile-for generation of {source!r}: give a preset name ({', '.join(PRESETS)}) or "
                          f"a zoo run directory")
    if model.family != "gpt":
        raise ConfigError(f"{source!r} is a {model.family} model; generation is compiled for decoders (gpt family)")
    return dataclasses.replace(model, dtype=dtype, param_dtype=dtype, scan_layers=scan and model.num_layers > 1)


def abstract_model(source: str, devices, dtype: str, mesh: MeshConfig | None, scan: bool = True):
    """(model config, model, mesh, params) of `source` on `devices`: the params abstract, laid out with the
    trainer's rules on `mesh` (default: tensor-parallel over every device); `scan` as `_config`."""
    import jax
    import jax.numpy as jnp
    import flax.linen as nn
    from zoo.models.gpt import Gpt
    from zoo.training import sharding
    model_cfg = _config(source, dtype, scan)
    model = Gpt(model_cfg)
    mesh_ = sharding.make_mesh(mesh or MeshConfig(data=1, fsdp=1, tensor=-1, expert=1), devices)
    boxed = jax.eval_shape(lambda r: model.init(r, jnp.zeros((1, 8), jnp.int32))["params"], jax.random.PRNGKey(0))
    sh = sharding.shardings(boxed, mesh_)
    params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), nn.unbox(boxed), sh)
    return model_cfg, model, mesh_, params


def compile_generate(source: str, target: str, *, rows: int = 8, prompt_len: int = 128, max_new_tokens: int = 128,
                     dtype: str = "bfloat16", mesh: MeshConfig | None = None) -> dict:
    """The report of `zoo.load(source).generate`'s program for `rows` prompts compiled for `target` (see the
    module's docstring): bytes per device (params, KV cache, temporaries) beside the chip's HBM and `fits`,
    FLOPs, collectives, kernels, compile seconds, and the estimated prefill time and time per new token."""
    import jax
    import jax.numpy as jnp
    import flax.linen as nn
    from zoo.infer import sample
    from zoo.training import sharding
    t = targets.parse(target)
    devices = targets.devices(t)
    model_cfg, model, mesh_, params = abstract_model(source, devices, dtype, mesh)
    total = prompt_len + max_new_tokens
    if total > model_cfg.max_len:
        raise ConfigError(f"prompt_len + max_new_tokens = {total} exceeds {source}'s {model_cfg.max_len} positions")
    rep = sharding.replicated(mesh_)
    prompt = jax.ShapeDtypeStruct((rows, prompt_len), jnp.int32, sharding=rep)
    key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=rep)
    pad = jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=rep)
    cache = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((rows, total), jnp.int32),
                                              decode=True))["cache"]
    cache_bytes = report.bytes_per_device(nn.unbox(cache))
    fixed = {"params": report.bytes_per_device(params), "optimizer": 0}
    # The program makes its cache and XLA lays it out: counted whole on each device, an upper bound where its
    # heads split over `tensor` (they do not where the KV heads do not divide it: SmolLM2's 3 over 4 chips).
    kv_per_device = cache_bytes
    t0 = time.perf_counter()
    with jax.set_mesh(mesh_):  # traced under the target's mesh: zoo.nn picks the TPU kernels
        out = report.compiled(lambda: sample._generate.lower(
            params, prompt, key, pad, model=model, max_new_tokens=max_new_tokens, temperature=0.0, top_k=0, top_p=1.0,
            vocab_limit=model_cfg.vocab_size, eos_id=None).compile(), fixed)
    seconds = time.perf_counter() - t0
    mem = out["bytes_per_device"]  # the KV cache is carried through the decode loop: counted whole at least once
    mem["kv_cache"] = int(kv_per_device)
    mem["total"] = max(mem["total"], mem["params"] + mem["kv_cache"] + mem["temporaries"] + mem["code"])
    chip = t.chip
    hbm = chip.hbm_bytes * t.chips / len(devices)
    n = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(params))
    per_token = (fixed["params"] + kv_per_device) / chip.hbm_bytes_per_s
    prefill = 2 * n * rows * prompt_len / (chip.bf16_flops * t.chips)
    return {**report.header(t, len(devices), mesh_),
            "program": f"generate of {source} ({dtype}): {rows} rows x {prompt_len} prompt + {max_new_tokens} new tokens",
            **out, "kv_cache_bytes": cache_bytes, "model_flops": float(2 * n * rows * total),
            "compile_seconds": seconds, "fits": out["flops_per_device"] is not None and out["bytes_per_device"]["total"] <= hbm,
            "estimate": {"prefill_s": prefill, "per_token_s": per_token,
                         "tokens_per_s": rows / per_token if per_token else 0.0}}
