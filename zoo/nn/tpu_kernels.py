"""Pallas kernels on TPU: splash attention (`splash_attention`) and the experts' grouped matmul (`gmm_experts`).

What `attention_impl=auto` and a mixture of experts run when the program is compiled for TPU devices (the
platform of the mesh it is traced under, `zoo.nn.layers.target_platform`; off TPU nothing here runs unless
asked for by name, and then in Pallas interpret mode: the numbers of the TPU kernel, at CPU speed).

Splash attention (jax.experimental.pallas.ops.tpu.splash_attention) takes causal or full attention, a sliding
window, packed rows (segment ids), logit soft-capping and grouped keys/values; `splash_unsupported_reason` says
why not otherwise (a bias, another mask, lengths off its 128-token blocks), and `attention` then runs XLA with
that reason logged once, as it does for cuDNN on a GPU. The experts run megablox's grouped matmul (gmm, and its
transpose tgmm for the kernels' gradient) over the token-expert assignments sorted by expert: each expert's
tokens only, no [M, E, F] product and no gathered kernel per token.

Under a mesh (`jax.set_mesh`, as train.py's compile for a TPU topology does) each kernel runs per shard in
shard_map, as MaxText wraps them: the batch (tokens) split over the data axes and heads (the experts' MLP width)
over `tensor`, as zoo.training.sharding.RULES splits `batch`, `heads` and `mlp`; a dim an axis does not divide is
left whole. Without a mesh the kernel sees the whole arrays (one device).

Block sizes. Splash: 512 queries x 512 keys per block in the forward kernel and in the fused backward one
(dq, dk and dv in one pass: one kernel fewer, as MaxText's tuned recipes set sa_use_fused_bwd_kernel); fewer
when a length is shorter, always a multiple of 128 dividing it. 512 is MaxText's default `sa_block_*` for
v5e/v5p/v6e: a block's q, k and v (512 x H each) and its 512 x 512 float32 logit tile (1 MiB) sit well inside
the scoped VMEM, and few grid steps (each costs ~0.35 us of pipeline overhead) keep the 128-wide (v5e) and
256-wide (v6e) MXUs fed; 128 is the kernel's floor (a block spans whole lanes), so lengths must be multiples
of 128. gmm: tiles of (512 rows, 1024 contracted, 1024 out), MaxText's megablox default (tile_batch_seq,
tile_embed_dim, tile_mlp_dim), clipped to the problem in whole 128-lane tiles (rows padded to the row tile):
big tiles amortise the per-tile overhead, and a 1024 x 1024 bf16 weight tile (2 MiB, double-buffered) still
fits VMEM. Neither is tuned on hardware here: no TPU was measured.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from zoo.nn.layers import target_platform

BATCH_AXES = ("data", "fsdp", "expert")  # mesh axes of the batch: zoo.training.sharding.RULES' "batch"
HEAD_AXES = ("tensor",)  # mesh axes of heads and MLP width: RULES' "heads" and "mlp"
LANES = 128  # a splash block spans whole 128-wide lanes: lengths and blocks are multiples of it
SPLASH_BLOCK = 512  # queries and keys per splash block (MaxText's sa_block_* default)
GMM_TILING = (512, 1024, 1024)  # gmm's (rows, contracted, out) tile (MaxText's megablox tiling default)
SPLASH_DTYPES = ("float32", "bfloat16")


def interpret_default() -> bool:
    """Pallas interpret mode unless the program is compiled for TPU devices."""
    return target_platform() != "tpu"


def traced_mesh():
    """The mesh the program is traced under (jax.set_mesh), or None (none set, or a single device)."""
    mesh = jax.sharding.get_abstract_mesh()
    return None if mesh.empty or mesh.size == 1 else mesh


def split_axes(mesh, names, dims) -> tuple | None:
    """The mesh axes of `names` (size > 1) that divide every dim of `dims`, as one PartitionSpec entry."""
    axes = tuple(a for a in names if a in mesh.shape and mesh.shape[a] > 1)
    size = math.prod(mesh.shape[a] for a in axes)
    if not axes or any(d % size for d in dims):
        return None
    return axes


def splash_unsupported_reason(q, k, v, bias=None, mask=None) -> str | None:
    """Why splash attention cannot take these operands (arrays, tracers or ShapeDtypeStructs), or None when it
    can. Causal or full attention, a sliding window and segment ids are given to it as such (not as a mask)."""
    if bias is not None:
        return "an additive bias (T5's relative positions): splash attention takes none"
    if mask is not None:
        return ("a mask beyond causal, sliding window and packed segments (padding, a KV cache): splash "
                "attention builds its mask from those alone")
    dtypes = {jnp.dtype(x.dtype).name for x in (q, k, v)}
    if len(dtypes) > 1 or dtypes.pop() not in SPLASH_DTYPES:
        return f"dtypes {', '.join(sorted({jnp.dtype(x.dtype).name for x in (q, k, v)}))} (splash attention " \
               f"takes one of {' or '.join(SPLASH_DTYPES)})"
    if not len(q.shape) == len(k.shape) == len(v.shape) == 4:
        return "query, key and value must be [batch, length, heads, head dim]"
    (_, T, N, H), (_, S, K, Hk), Hv = q.shape, k.shape, v.shape[3]
    if N % K:
        return f"{N} query heads are not a multiple of {K} key/value heads"
    if Hk != H or Hv != H:
        return f"head dims differ (query {H}, key {Hk}, value {Hv})"
    if T % LANES or S % LANES:
        return f"lengths T={T}, S={S} (splash attention's blocks are multiples of {LANES} tokens)"
    return None


def _block(length: int) -> int:
    """The largest of SPLASH_BLOCK, 256, 128 that divides `length` (a multiple of 128)."""
    b = SPLASH_BLOCK
    while length % b:
        b //= 2
    return b


def _splash_kernel(heads: int, T: int, S: int, is_causal: bool, window: int, softcap: float, interpret: bool):
    """make_splash_mha for `heads` heads of [T, S] (its mask's block map is numpy work at trace time, which
    jax caches per mask; the kernel holds it as arrays of this trace, so it is made per call)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
    if window:  # i - j < window; with is_causal also j <= i
        mask = sm.LocalMask((T, S), window_size=(window - 1, 0 if is_causal else None), offset=0)
    elif is_causal:
        mask = sm.CausalMask((T, S))
    else:
        mask = sm.FullMask((T, S))
    bq, bkv = _block(T), _block(S)
    blocks = sk.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv, block_q_dkv=bq, block_kv_dkv=bkv,
                           block_kv_dkv_compute=bkv, use_fused_bwd_kernel=True)
    return sk.make_splash_mha(sm.MultiHeadMask((mask,) * heads), block_sizes=blocks, head_shards=1,
                              q_seq_shards=1, attn_logits_soft_cap=softcap or None, interpret=interpret)


def splash_attention(q_BTNH, k_BSKH, v_BSKH, *, scale=None, is_causal=False, segment_ids_BT=None, window=0,
                     local=None, softcap: float = 0.0, interpret: bool | None = None):
    """softmax(q k^T * scale, capped, masked) v by splash attention: causal or not, a query seeing only keys
    less than `window` positions back (window > 0; on a layer where `local` is not False, a traced `local`
    choosing per call), within its own packed example (equal `segment_ids_BT`), logits capped to
    softcap * tanh(s / softcap) (softcap > 0). Takes what `splash_unsupported_reason` accepts."""
    if window and local is not None and local is not True and local is not False:  # a scanned stack's flag
        kw = dict(scale=scale, is_causal=is_causal, segment_ids_BT=segment_ids_BT, softcap=softcap,
                  interpret=interpret)
        return jax.lax.cond(local, lambda: splash_attention(q_BTNH, k_BSKH, v_BSKH, window=window, **kw),
                            lambda: splash_attention(q_BTNH, k_BSKH, v_BSKH, **kw))
    window = window if local is not False else 0
    interpret = interpret_default() if interpret is None else interpret
    T, S, H = q_BTNH.shape[1], k_BSKH.shape[1], q_BTNH.shape[3]
    scale = H ** -0.5 if scale is None else scale
    # splash applies no scale: on q, in its dtype, as einsum_attention does. [B, N, T, H]: the kernel's layout.
    q_BNTH = (q_BTNH * jnp.asarray(scale, q_BTNH.dtype)).transpose(0, 2, 1, 3)
    k_BKSH, v_BKSH = k_BSKH.transpose(0, 2, 1, 3), v_BSKH.transpose(0, 2, 1, 3)

    def run(q_BNTH, k_BKSH, v_BKSH, *segments):
        kernel = _splash_kernel(q_BNTH.shape[1], T, S, bool(is_causal), int(window), float(softcap), interpret)
        if not segments:
            return jax.vmap(kernel)(q_BNTH, k_BKSH, v_BKSH)
        from jax.experimental.pallas.ops.tpu.splash_attention import SegmentIds
        return jax.vmap(lambda q, k, v, s: kernel(q, k, v, SegmentIds(s, s)))(q_BNTH, k_BKSH, v_BKSH, *segments)

    args = (q_BNTH, k_BKSH, v_BKSH) + (() if segment_ids_BT is None else (segment_ids_BT.astype(jnp.int32),))
    mesh = traced_mesh()
    if mesh is None:
        out_BNTH = run(*args)
    else:
        batch = split_axes(mesh, BATCH_AXES, (q_BTNH.shape[0],))
        heads = split_axes(mesh, HEAD_AXES, (q_BTNH.shape[2], k_BSKH.shape[2]))
        qkv = P(batch, heads, None, None)
        out_BNTH = jax.shard_map(run, mesh=mesh, in_specs=(qkv,) * 3 + (P(batch, None),) * (len(args) - 3),
                                 out_specs=qkv, check_vma=False)(*args)
    return out_BNTH.transpose(0, 2, 1, 3)


def _tile(dim: int, tile: int) -> int:
    """`tile`, or `dim` rounded up to whole 128-lane tiles if smaller: a multiple of 128 either way, since
    gmm's backward reuses the tiling with the contracted and output dims swapped (a partial last tile is masked)."""
    return min(tile, -(-dim // LANES) * LANES)


def gmm_experts(x_MD, top_MR, expert_MR, gate_EDF, fc_EDF, proj_EFD, activation, *, interpret: bool | None = None):
    """y_MD = sum over each token's R experts of weight * proj(act(x gate) * (x fc)), each expert on its own
    tokens by megablox's gmm: the M * R assignments sorted by expert (stable), rows padded to the row tile
    (outside every group: never computed, sliced off), results put back in token order."""
    interpret = interpret_default() if interpret is None else interpret
    E = gate_EDF.shape[0]

    def run(x_MD, top_MR, expert_MR, gate_EDF, fc_EDF, proj_EFD):
        from jax.experimental.pallas.ops.tpu.megablox import gmm
        (M, D), R, F = x_MD.shape, expert_MR.shape[1], gate_EDF.shape[2]
        A = M * R
        tm = GMM_TILING[0] if A >= GMM_TILING[0] else -(-A // LANES) * LANES  # the row tile
        pad = -A % tm  # rows past every group: gmm never computes them
        order_A = jnp.argsort(expert_MR.reshape(-1), stable=True)
        sizes_E = jnp.bincount(expert_MR.reshape(-1), length=E).astype(jnp.int32)
        xs_AD = jnp.pad(jnp.take(x_MD, order_A // R, axis=0), ((0, pad), (0, 0)))
        gm = functools.partial(gmm, group_sizes=sizes_E, preferred_element_type=x_MD.dtype, interpret=interpret)
        tile_in = (tm, _tile(D, GMM_TILING[1]), _tile(F, GMM_TILING[2]))
        h_AF = activation(gm(xs_AD, gate_EDF, tiling=tile_in)) * gm(xs_AD, fc_EDF, tiling=tile_in)
        ys_AD = gm(h_AF, proj_EFD, tiling=(tm, _tile(F, GMM_TILING[1]), _tile(D, GMM_TILING[2])))[:A]
        y_MRD = jnp.take(ys_AD, jnp.argsort(order_A), axis=0).reshape(M, R, D)
        y_MD = jnp.einsum("MRD,MR->MD", y_MRD, top_MR.astype(y_MRD.dtype))
        return y_MD

    args = (x_MD, top_MR, expert_MR, gate_EDF, fc_EDF, proj_EFD)
    mesh = traced_mesh()
    if mesh is None:
        return run(*args)
    batch = split_axes(mesh, BATCH_AXES, (x_MD.shape[0],))
    width = split_axes(mesh, HEAD_AXES, (gate_EDF.shape[2],))

    def sharded(*a):  # each shard's tokens through every expert's slice of the MLP width: partial sums over it
        y_MD = run(*a)
        return y_MD if width is None else jax.lax.psum(y_MD, width)

    tokens = P(batch, None)
    return jax.shard_map(sharded, mesh=mesh, check_vma=False, out_specs=tokens,
                         in_specs=(tokens, tokens, tokens, P(None, None, width), P(None, None, width),
                                   P(None, width, None)))(*args)
