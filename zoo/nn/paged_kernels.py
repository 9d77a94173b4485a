"""A decoding step's attention over the page pool by a kernel that reads each row's pages where they lie: jax's
Pallas ragged paged-attention kernel on a TPU ("tpu"), zoo's C++ kernel on a CPU ("cpu", zoo.nn.cpu_kernels: the
pool as the TPU kernel takes it, float32, any head dim, any number of key/value heads dividing the query heads).

Without a kernel (`--paged-kernel off`, or one that cannot take the model) the engine's pool is a `[pages, PAGE, K,
H]` array each for keys and values, and each layer gathers its rows' pages where its attention reads them
(zoo.nn.paged_cache). On a CPU, XLA's gather and its products over the gathered length made 32 rows' attention 5x
its bandwidth bound (the README's "Why 32 rows stop short of 8x"). On a TPU that gather copies every row's pages out
of the pool at every layer and step; jax ships the kernel written for vLLM's TPU backend
(jax.experimental.pallas.ops.tpu.ragged_paged_attention), which reads each row's pages where they lie, up to the
row's length, a block of pages at a time (double-buffered DMAs), grouped-query heads per key/value head (no
repeat). It takes keys and values as one pool, `[pages, PAGE, 2K, H]`, each key head followed by its value head:
where it runs, a layer's `cached_key` variable holds that pool and `cached_value` is empty
(zoo.engine.pages.pool_of). That layout is also what lets a decoding step write its token in place: a token's
[2K, H] is whole (8, 128) tiles of the pool, where in a heads-first `[K, pages, PAGE, H]` pool (jax's older
paged_attention kernel's) it is one row of a tile, and XLA then kept the loop's pool in another layout and copied
each layer's whole pool into the kernel's at every step (found compiling for a v5e: 316 MB of temporaries a chip
against 126 MB gathering; this layout: no copy, 118 MB). A prefill (many queries a row) reads the pool by the
gather.

What the TPU kernel takes (else `unsupported_reason` says why and the pages are gathered): one query a row, a head dim
that is a multiple of 128, key/value heads the kernel tiles whole (K in 1, 2, 4, 8 or a multiple of 8 in bfloat16; 1, 2,
4 or a multiple of 4 in float32: SmolLM2's 3 are refused), float32 or bfloat16, no bias, no sliding window (logit
soft-capping it takes). Under a mesh the kernel runs per shard of the key/value heads (shard_map over `tensor`,
as zoo.nn.tpu_kernels does for splash attention). It runs on a TPU only: Pallas's TPU interpret mode, which runs
the splash and grouped-matmul kernels on this CPU, cannot run this one (jax 0.10 to 0.12: its ref reshapes), so the
tests check zoo's side of it here (the pool, its writes, the arguments, through a stand-in that answers as jax's
`ref_ragged_paged_attention` does) and compile it for a v5e (zoo.aot.serve).

Blocks: PAGES_PER_BLOCK pages (128 tokens) of keys and values and QUERIES_PER_BLOCK queries a block, fewer where
a row's table is shorter; given, not looked up (jax's tuned table reads the default device's kind, a CPU's when
compiling for a TPU from this host). Not tuned on hardware: no TPU was measured.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from zoo.nn import tpu_kernels
from zoo.nn.layers import target_platform

KERNELS = ("tpu", "cpu")
# platform -> the kernel zoo-serve's `--paged-kernel auto` runs there
AUTO = {"tpu": "tpu", "cpu": "cpu"}
PAGES_PER_BLOCK = 8
QUERIES_PER_BLOCK = 8
DTYPES = {"tpu": ("float32", "bfloat16"), "cpu": ("float32",)}


def choose(setting: str | None, platform: str) -> str | None:
    """The kernel a `paged_kernel` setting runs on `platform`: "auto" the platform's
    (AUTO), "off" (or None) none, "tpu" or "cpu" that one. Anything else: one line naming the choices."""
    if setting in (None, "off"):
        return None
    if setting == "auto":
        return AUTO.get(platform)
    if setting not in KERNELS:
        raise ValueError(f"paged attention kernel {setting!r}: choose auto, off, {', '.join(KERNELS)}")
    return setting


def _heads_reason(N: int, K: int, dtype) -> str | None:
    """Why the kernel cannot tile N query heads on K key/value heads of `dtype`, or None."""
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention.kernel import get_min_heads_per_blk
    if N % K:
        return f"{N} query heads are not a multiple of {K} key/value heads"
    try:
        get_min_heads_per_blk(N, 2 * K, dtype, dtype)
    except ValueError:
        return f"{K} key/value heads in {jnp.dtype(dtype).name} (the kernel tiles 1, 2, 4, 8 or a multiple of 8)"
    return None


def unsupported_reason(q_BTNH, kv_pool, *, bias=None, mask=None, window: int = 0, kernel: str = "tpu") -> str | None:
    """Why `kernel` cannot take this decoding step (queries [B, T, N, H], the pool [P, PAGE, 2K, H]), or None."""
    T, N, H = q_BTNH.shape[1:]
    K = kv_pool.shape[2] // 2
    if T != 1:
        return f"{T} queries a row (a prefill): the kernel decodes one"
    if bias is not None or mask is not None:
        return "a bias or a mask beyond the rows' lengths"
    if window:
        return "a sliding window"
    dtypes = {jnp.dtype(x.dtype).name for x in (q_BTNH, kv_pool)}
    if len(dtypes) > 1 or not dtypes <= set(DTYPES[kernel]):
        return f"dtypes {', '.join(sorted(dtypes))} (it takes {' or '.join(DTYPES[kernel])})"
    if kernel == "cpu":
        return f"{N} query heads are not a multiple of {K} key/value heads" if N % K else None
    if H % 128:
        return f"head dim {H}: the TPU kernel's blocks are whole 128-lane tiles"
    return _heads_reason(N, K, kv_pool.dtype)


def available(kernel: str, platform: str) -> str | None:
    """Why `kernel` cannot run on `platform`, or None."""
    if kernel == "cpu":
        if platform != "cpu":
            return "the cpu kernel runs on a CPU only"
        from zoo.nn import cpu_kernels
        return cpu_kernels.unavailable()
    return None if platform == kernel else f"the {kernel} kernel runs on a TPU only (its interpret mode does not run)"


def for_model(setting: str | None, cfg, dtype, platform: str | None = None, tensor: int = 1):
    """(the kernel a decoder of model config `cfg` decodes by, or None; why not, where the setting chose one that
    cannot take it): the platform, its heads (per shard of `tensor`), head dim, activations' `dtype` and window
    checked up front."""
    platform = platform or target_platform()
    kernel = choose(setting, platform)
    if kernel is None:
        return None, None
    N, H = cfg.num_heads, cfg.head_dim
    K = cfg.num_kv_heads or N
    if tensor > 1 and K % tensor == 0 and N % tensor == 0:  # each chip's share (zoo.aot.serve lays them out so)
        N, K = N // tensor, K // tensor
    q = jax.ShapeDtypeStruct((1, 1, N, H), dtype)
    pool = jax.ShapeDtypeStruct((1, 16, 2 * K, H), dtype)
    why = available(kernel, platform) or unsupported_reason(q, pool, window=getattr(cfg, "sliding_window", 0) or 0,
                                                            kernel=kernel)
    return (None, why) if why else (kernel, None)


def kernel_call(q_TNH, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, **kw):
    """jax's ragged paged attention (the tests put a stand-in here)."""
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention
    return ragged_paged_attention(q_TNH, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, **kw)


def _run(kernel: str, scale: float, softcap: float, q_BNH, kv_pool, lengths_B, table_BN):
    if kernel == "cpu":
        from zoo.nn import cpu_kernels
        return cpu_kernels.attend(q_BNH, kv_pool, lengths_B, table_BN, scale=scale, softcap=softcap)
    B = q_BNH.shape[0]  # a row is a sequence of one query
    return kernel_call(q_BNH, kv_pool, lengths_B, table_BN, jnp.arange(B + 1, dtype=jnp.int32),
                       jnp.array([B], jnp.int32), sm_scale=scale, soft_cap=softcap or None,
                       num_kv_pages_per_block=min(PAGES_PER_BLOCK, table_BN.shape[1]),
                       num_queries_per_block=QUERIES_PER_BLOCK)


def attend(q_BTNH, kv_pool, positions_BT, table_BN, *, scale=None, softcap: float = 0.0, kernel: str = "tpu"):
    """One query a row ([B, 1, N, H], at positions_BT [B, 1]; a negative position: a free row, its output unused)
    attending over its positions 0..p in its pages of the combined pool [P, PAGE, 2K, H] (written already), by
    `kernel`; returns [B, 1, N, H]."""
    B, _, N, H = q_BTNH.shape
    scale = H ** -0.5 if scale is None else scale
    lengths_B = jnp.maximum(positions_BT[:, 0] + 1, 1).astype(jnp.int32)  # a free row reads its scratch page
    run = lambda *a: _run(kernel, scale, softcap, *a)  # noqa: E731
    args = (q_BTNH[:, 0], kv_pool, lengths_B, table_BN.astype(jnp.int32))
    mesh = tpu_kernels.traced_mesh()
    if mesh is None:
        out_BNH = run(*args)
    else:  # a Mosaic kernel is never partitioned by XLA: per shard of the key/value heads (and their query
        # heads, each shard whole key-value pairs) where `tensor` splits them, else whole on every device
        t = tpu_kernels.split_axes(mesh, tpu_kernels.HEAD_AXES, (kv_pool.shape[2] // 2, N))
        heads = P(None, t, None)
        out_BNH = jax.shard_map(run, mesh=mesh, in_specs=(heads, P(None, None, t), P(), P()), out_specs=heads,
                                check_vma=False)(*args)
    return out_BNH[:, None].astype(q_BTNH.dtype)


def decode_step(attn, q_BTNH, k_BTKH, v_BTKH, positions_BT, *, mask=None, bias=None, window: int = 0):
    """Attention module `attn`'s decoding step by the kernel of the paged cache it is traced under
    (zoo.nn.paged_cache.paged), its keys and values written into the pool first; None where there is no such
    kernel or it cannot take the step (a prefill gathers; anything else is logged once, then gathers)."""
    from zoo.nn import paged_cache
    from zoo.nn.attention_backend import note_fallback
    paged = paged_cache.current()
    if paged is None or paged.kernel is None or not attn.has_variable("cache", "cached_key"):
        return None
    why = unsupported_reason(q_BTNH, attn.get_variable("cache", "cached_key"), bias=bias, mask=mask, window=window,
                             kernel=paged.kernel)
    if why is not None:
        if q_BTNH.shape[1] == 1:
            note_fallback(why, kernel=f"the {paged.kernel} paged-attention kernel (the pages gathered)")
        return None
    key, value = attn.variable("cache", "cached_key"), attn.variable("cache", "cached_value")
    paged_cache.write(key, value, k_BTKH, v_BTKH, positions_BT, paged)
    return attend(q_BTNH, key.value, positions_BT, paged.table_BN, scale=attn.scale, softcap=attn.softcap,
                  kernel=paged.kernel)
