"""A decoding step's attention over the page pool by jax's Pallas paged-attention kernels, on TPU (and GPU by name).

On a CPU the engine's pool is `[pages, PAGE, K, H]` and each layer gathers its rows' pages where its attention reads
them (zoo.nn.paged_cache). On a TPU that gather copies every row's pages out of the pool at every layer and step;
jax ships a kernel that reads the pages where they lie instead (jax.experimental.pallas.ops.tpu.paged_attention,
the kernel JetStream decoded with): one query per row, grouped-query heads read per key/value head (no repeat),
each row's pages streamed from HBM a block at a time up to its length (a row of 100 tokens in a 2,048-slot table
reads 7 pages, not 128), double-buffered. It takes the pool as `[K, pages, PAGE, H]`, so where it runs the engine
lays its pool out heads first (zoo.engine.pages.pool_of); a prefill (many queries a row) reads it by the gather.
"auto" chooses no kernel yet (see AUTO): a kernel runs where it is named (zoo-serve --paged-kernel tpu).

    kernel   chosen       what it needs (else `unsupported_reason` says why, and the gather runs)
    tpu      by name      head dim a multiple of 128 (Mosaic tiles the block's last dim by 128 lanes), float32 or
                          bfloat16, no bias, no sliding window (logit soft-capping it takes)
    gpu      by name      jax.experimental.pallas.ops.gpu.paged_attention (Triton): the same, head dim a power of
                          two of at least 16; never compiled for a GPU here

Off its platform a kernel runs in Pallas interpret mode (the TPU's by `pltpu.force_tpu_interpret_mode`): the
kernel's own program at CPU speed, which is how the tests check it here. Under a mesh the kernel runs per shard of
the key/value heads (shard_map over `tensor`, as zoo.nn.tpu_kernels does for splash attention).

Blocks: `PAGES_PER_BLOCK` pages (128 tokens) a compute block where the table's width allows (the largest power of
two dividing it, at most that): jax's own paged-attention benchmarks use 4 to 16 pages of 16. Not tuned on
hardware: no TPU was measured. megacore_mode stays None (right on every chip; a v4/v5p's second TensorCore could
take half the rows).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from zoo.nn.layers import target_platform

KERNELS = ("tpu", "gpu")
# platform -> the kernel "auto" runs there: none yet. Compiled for a v5e:2x2 (qwen3_0_6b, 32 rows, 2,048 slots,
# tensor-parallel), XLA lays the loop-carried pool out pages-major and copies it to the kernel's row-major layout
# at every layer and step (temporaries 316 MB against the gather's 126 MB), so "auto" gathers until that is gone.
AUTO: dict[str, str] = {}
PAGES_PER_BLOCK = 8
DTYPES = ("float32", "bfloat16")


def choose(setting: str | None, platform: str | None = None) -> str | None:
    """The kernel a `paged_kernel` setting runs on `platform` (default: the traced one): "auto" the platform's
    (AUTO), "off" (or None) none, "tpu" / "gpu" that one. Anything else: one line naming the choices."""
    if setting in (None, "off"):
        return None
    if setting == "auto":
        return AUTO.get(platform or target_platform())
    if setting not in KERNELS:
        raise ValueError(f"paged attention kernel {setting!r}: choose auto, off, {', '.join(KERNELS)}")
    return setting


def unsupported_reason(kernel: str, q_BTNH, k_pool, *, bias=None, mask=None, window: int = 0) -> str | None:
    """Why `kernel` cannot take this decoding step (queries [B, T, N, H], the heads-first pool [K, P, PAGE, H]),
    or None when it can."""
    T, N, H = q_BTNH.shape[1:]
    K = k_pool.shape[0]
    if T != 1:
        return f"{T} queries a row (a prefill): the kernel takes one"
    if bias is not None or mask is not None:
        return "a bias or a mask beyond the rows' lengths"
    if window:
        return "a sliding window"
    if N % K:
        return f"{N} query heads are not a multiple of {K} key/value heads"
    dtypes = {jnp.dtype(x.dtype).name for x in (q_BTNH, k_pool)}
    if len(dtypes) > 1 or not dtypes <= set(DTYPES):
        return f"dtypes {', '.join(sorted(dtypes))} (it takes one of {' or '.join(DTYPES)})"
    if kernel == "tpu" and H % 128:
        return f"head dim {H}: the TPU kernel's blocks are whole 128-lane tiles"
    if kernel == "gpu" and (H < 16 or H & (H - 1)):
        return f"head dim {H}: the GPU kernel takes a power of two of at least 16"
    return None


def _block(pages: int) -> int:
    """The largest power of two dividing `pages`, at most PAGES_PER_BLOCK."""
    return math.gcd(pages, PAGES_PER_BLOCK)


def _run(kernel: str, interpret: bool, scale: float, softcap: float, q_BNH, k_pool, v_pool, lengths_B, table_BN):
    cap = softcap or None
    q_BNH = q_BNH * jnp.asarray(scale, q_BNH.dtype)  # the kernels apply no scale: on q, as einsum_attention does
    block = _block(table_BN.shape[1])
    if kernel == "tpu":
        from jax.experimental.pallas import tpu as pltpu
        from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention
        call = lambda: paged_attention(q_BNH, k_pool, v_pool, lengths_B, table_BN,  # noqa: E731
                                       pages_per_compute_block=block, attn_logits_soft_cap=cap)
        if not interpret:
            return call()
        with pltpu.force_tpu_interpret_mode():
            return call()
    from jax.experimental.pallas.ops.gpu.paged_attention import paged_attention
    return paged_attention(q_BNH, k_pool, v_pool, table_BN, lengths_B, pages_per_compute_block=block,
                           k_splits=math.gcd(table_BN.shape[1] // block, 16), interpret=interpret,
                           attn_logits_soft_cap=cap)


def attend(kernel: str, q_BTNH, k_pool, v_pool, positions_BT, table_BN, *, scale=None, softcap: float = 0.0,
           interpret: bool | None = None):
    """One query a row ([B, 1, N, H], at positions_BT [B, 1]; a negative position: a free row, whose output is
    zeros) attending over its positions 0..p in its pages of the heads-first pools [K, P, PAGE, H] (written
    already), by `kernel`; returns [B, 1, N, H]. `interpret`: None runs interpret mode off the kernel's platform."""
    B, _, N, H = q_BTNH.shape
    scale = H ** -0.5 if scale is None else scale
    interpret = target_platform() != kernel if interpret is None else interpret
    lengths_B = jnp.maximum(positions_BT[:, 0] + 1, 0).astype(jnp.int32)
    run = lambda *a: _run(kernel, interpret, scale, softcap, *a)  # noqa: E731
    args = (q_BTNH[:, 0], k_pool, v_pool, lengths_B, table_BN.astype(jnp.int32))
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        out_BNH = run(*args)
    else:  # a Mosaic kernel is never partitioned by XLA: per shard of the key/value heads (and their query
        # heads) where `tensor` splits them, as the pool is laid out (zoo.aot.serve), else whole on every device
        tensor = mesh.shape.get("tensor", 1)
        t = "tensor" if tensor > 1 and k_pool.shape[0] % tensor == 0 and N % tensor == 0 else None
        heads = P(None, t, None)
        out_BNH = jax.shard_map(run, mesh=mesh, in_specs=(heads, P(t), P(t), P(), P()), out_specs=heads,
                                check_vma=False)(*args)
    return out_BNH[:, None].astype(q_BTNH.dtype)


def for_model(setting: str | None, cfg, dtype, platform: str | None = None) -> tuple[str | None, str | None]:
    """(the kernel a decoder of model config `cfg` decodes by, or None; why not, where `setting` asked for one that
    cannot take it): its heads, head dim, activations' `dtype` and sliding window checked once, up front."""
    kernel = choose(setting, platform)
    if kernel is None:
        return None, None
    N, H = cfg.num_heads, cfg.head_dim
    K = cfg.num_kv_heads or N
    q = jax.ShapeDtypeStruct((1, 1, N, H), dtype)
    pool = jax.ShapeDtypeStruct((K, 1, 16, H), dtype)
    why = unsupported_reason(kernel, q, pool, window=getattr(cfg, "sliding_window", 0) or 0)
    return (None, why) if why else (kernel, None)
