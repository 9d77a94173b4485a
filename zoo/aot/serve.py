"""zoo-serve's engine compiled for a target (`zoo-serve SOURCE --compile-for v5e:2x2`, `zoo.compile_for(...,
program="serve")`): the two programs the engine (zoo.engine.batching) runs while it serves, at their largest shapes,

  decode   a chunk of `chunk` steps of all `slots` rows over the whole cache (`max_len` slots): the program that
           runs for every token served, carrying the KV cache of every row;
  prefill  one row's prompt of up to `max_len` tokens into its cache row,

with the params abstract (nothing loaded) and laid out as generation's are (zoo.aot.decode: tensor-parallel over
the chips), the layers one after another as the engine runs them (`scan_layers`: one scan, a faster compile;
until 2026-11-30 the report compiled the scan whatever the engine ran), the decode's attention by jax's paged
kernel where the engine would run it (zoo.nn.paged_kernels), and the engine's cache its own argument, its KV heads
split over `tensor` where they divide it (else whole on every chip). The report is the decode program's, with the
prefill's figures under "prefill" and `fits` true only when both fit. The estimate per chunk step is (params + KV
cache bytes per device) / HBM bandwidth.
"""

from __future__ import annotations

import functools
import time

import numpy as np

from zoo.aot import decode, report, target as targets
from zoo.configuration import MeshConfig
from zoo.errors import ConfigError

DEFAULT_MAX_LEN = 2048  # zoo-serve's cache length when --max-len is not given: the model's context, at most this


def _cache(model, slots: int, max_len: int, mesh, combined: bool):
    """The engine's KV cache (its pool of pages, zoo.engine.pages; keys and values one pool for a paged-attention
    kernel) as abstract arrays: KV heads over `tensor` where they divide it, else whole."""
    import jax
    import jax.numpy as jnp
    import flax.linen as nn
    from jax.sharding import NamedSharding, PartitionSpec as P
    from zoo.engine import pages
    cache = nn.unbox(jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((slots, max_len), jnp.int32),
                                                       decode=True))["cache"])
    ax = 1 if model.cfg.scan_layers else 0
    cache = pages.pool_of(cache, ax, pages.default_pages(slots, max_len), combined)  # the engine's pool of pages
    tensor = mesh.shape.get("tensor", 1)
    split = 2 * tensor if combined else tensor  # a combined pool's shards hold whole key-value pairs

    def laid(a):  # [layers,] pages, page slots, KV heads (2K combined), head dim
        if a.ndim > ax + 2 and a.shape[ax + 2] % split == 0:
            spec = [None] * a.ndim
            spec[ax + 2] = "tensor"
            return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, P(*spec)))
        return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, P()))
    return jax.tree.map(laid, cache), ax


def compile_serve(source: str, target: str, *, slots: int = 8, max_len: int | None = None, chunk: int = 8,
                  dtype: str = "bfloat16", mesh: MeshConfig | None = None, paged_kernel: str = "auto",
                  scan_layers: bool = False) -> dict:
    """The report of zoo-serve's engine for `source` (a preset name or a zoo run) compiled for `target` with
    `slots` rows, a cache of `max_len` slots (default: the model's context, at most DEFAULT_MAX_LEN) and chunks of
    `chunk` steps, its layers one after another (`scan_layers`: as one scan), as `zoo-serve SOURCE --slots
    --max-len --chunk --paged-kernel [--scan-layers]` would run it (see the module's docstring)."""
    import jax
    import jax.numpy as jnp
    from zoo.engine import programs
    from zoo.engine.pages import PAGE
    from zoo.training import sharding
    for name, v in (("slots", slots), ("chunk", chunk), ("max_len", max_len or 2)):
        if v < 1 or (name == "max_len" and v < 2):
            raise ConfigError(f"--{name.replace('_', '-')} {v} must be >= {2 if name == 'max_len' else 1}")
    t = targets.parse(target)
    devices = targets.devices(t)
    model_cfg, model, mesh_, params = decode.abstract_model(source, devices, dtype, mesh, scan=scan_layers)
    max_len = min(max_len or DEFAULT_MAX_LEN, model_cfg.max_len)
    from zoo.nn import paged_kernels
    kernel, why = paged_kernels.for_model(paged_kernel, model_cfg, dtype, platform="tpu",  # as the engine chooses
                                          tensor=mesh_.shape.get("tensor", 1))
    if why and paged_kernel != "auto":
        raise ConfigError(f"--paged-kernel {paged_kernel}: {why}")
    cache, ax = _cache(model, slots, max_len, mesh_, bool(kernel))
    rep = sharding.replicated(mesh_)
    arg = lambda shape, dt: jax.ShapeDtypeStruct(shape, dt, sharding=rep)  # noqa: E731
    V = model_cfg.vocab_size
    logits = arg((slots, V), jnp.float32)
    fixed = {"params": report.bytes_per_device(params), "optimizer": 0}
    kv = report.bytes_per_device(cache)
    step = jax.jit(functools.partial(programs.decode_chunk, model, V, ax, kernel=kernel),
                   static_argnames=("B", "K", "L"), donate_argnums=(1, 3))
    fill = jax.jit(functools.partial(programs.prefill, model, kernel=kernel), donate_argnums=(1, 3))
    N = -(-max_len // PAGE)  # a row's pages
    t0 = time.perf_counter()
    with jax.set_mesh(mesh_):  # traced under the target's mesh: zoo.nn picks the TPU kernels
        out = report.compiled(lambda: step.lower(
            params, cache, arg((slots, N), jnp.int32), logits, arg((slots,), jnp.int32), arg((slots,), jnp.float32),
            arg((slots,), jnp.int32), arg((slots,), jnp.float32), arg((slots, 2), jnp.uint32), arg((slots,), jnp.int32),
            arg((slots, (V + 31) // 32), jnp.int32), B=slots, K=chunk, L=max_len).compile(), fixed)
        seconds = time.perf_counter() - t0
        one = arg((1,), jnp.int32)  # the row, the prompt's length, its start and where its writes start
        pre = report.compiled(lambda: fill.lower(params, cache, arg((1, N), jnp.int32), logits, one,
                                                 arg((1, max_len), jnp.int32), one, one, one).compile(), fixed)
    pre_seconds = time.perf_counter() - t0 - seconds
    chip = t.chip
    hbm = chip.hbm_bytes * t.chips / len(devices)
    for r in (out, pre):  # the cache is an argument of both (donated: its output aliases it)
        r["bytes_per_device"]["kv_cache"] = int(kv)
    n = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(params))
    per_token = (fixed["params"] + kv) / chip.hbm_bytes_per_s
    prefill_s = 2 * n * max_len / (chip.bf16_flops * t.chips)
    fits = all(r["flops_per_device"] is not None and r["bytes_per_device"]["total"] <= hbm for r in (out, pre))
    return {**report.header(t, len(devices), mesh_),
            "program": f"zoo-serve engine of {source} ({dtype}): decode of {slots} rows x {chunk} steps over "
                       f"{max_len} slots (prefill of one prompt of up to {max_len} tokens below)",
            **out, "kv_cache_bytes": int(kv), "model_flops": float(2 * n * slots * chunk),
            "compile_seconds": seconds, "fits": fits,
            "prefill": {"bytes_per_device": pre["bytes_per_device"], "flops_per_device": pre["flops_per_device"],
                        "kernels": pre["kernels"], "compile_seconds": pre_seconds, "refused": pre.get("refused")},
            "engine": {"slots": slots, "max_len": max_len, "chunk": chunk,
                       "paged_attention": f"the {kernel} Pallas kernel" if kernel else
                       f"pages gathered ({why or '--paged-kernel ' + paged_kernel})", "scan_layers": scan_layers},
            "estimate": {"prefill_s": prefill_s, "per_token_s": per_token,
                         "tokens_per_s": slots / per_token if per_token else 0.0}}
