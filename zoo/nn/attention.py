"""Attention: the one entry point `attention()`, zoo's einsum softmax (`einsum_attention`), the cuDNN calls, and
the multi-head `Attention` module.

`attention()` runs zoo's einsum softmax (`einsum_attention`) on CPU, or `jax.nn.dot_product_attention` with the
backend `model.attention_impl` names; the choice per platform and shape is zoo.nn.attention_backend
(`resolve_attention`, `cudnn_unsupported_reason`, `select_backend`, `FALLBACKS`). On an NVIDIA GPU `auto` is cuDNN
flash attention wherever `cudnn_unsupported_reason` finds nothing against the shapes and dtype, and on TPU splash
attention (Pallas, zoo.nn.tpu_kernels) wherever `splash_unsupported_reason` finds nothing, else XLA, with the reason
logged once. The platform is the one the program is traced for (the mesh's devices under jax.set_mesh, else jax's
default backend), so a TPU program compiled on a CPU host gets TPU kernels. Masks (zoo.nn.masks) are boolean,
True = may attend, shaped [B, 1, T, S] (broadcastable). Packed examples (several per row, chat fine-tuning) come
as segment ids, which the same entry point turns into a segment mask, or into cuDNN's packed layout (each
example's length and offset). The names of zoo.nn.masks and zoo.nn.attention_backend are imported here too, so
callers keep reading them from this module.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.nn import cpu_kernels, paged_cache, paged_kernels, tpu_kernels
from zoo.nn.attention_backend import (  # noqa: F401 (CUDNN_DTYPES ... _dbias_exported: read from here by others)
    CUDNN_DTYPES, FALLBACKS, IMPLEMENTATIONS, _dbias_exported, cudnn_unsupported_reason, gpu_compute_capability,
    note_fallback, resolve_attention, select_backend)
from zoo.nn.layers import Dtype, Einsum, einsum_f32, fused_t, rms_norm, rms_norm_plus1, softcap as soft_cap
from zoo.nn.masks import (  # noqa: F401 (padding_mask: read from here by others)
    causal_mask, packed_layout, padding_mask, segment_mask, window_mask)
from zoo.nn.positions import Rope
from zoo.nn.tpu_kernels import splash_unsupported_reason  # noqa: F401 (read from here by others)


# Grouped attention reads each key/value head where it lies up to this many queries. Measured on the 2-core CPU
# (2026-11-28, float32, 32 rows, 9 query heads on 3 KV heads, H 64, a 256-slot cache): one decoding step's
# attention 9.0-9.6 ms grouped against 44-45 ms repeated; a causal training step's forward and backward at
# T 256 (B 8, 4 on 2 heads) 75-79 ms grouped against 53-57 ms repeated, and the plain 4-axis einsums when K = N.
GROUPED_QUERIES = 16
# A decoding step's single query per row reads the grouped cache [B, S, K, H] as it lies, by products and sums,
# instead of two dot products: XLA:CPU's batched dot wants the batch axes (B, K) leading, and so copied every
# layer's whole key and value cache into [B, K, H, S] and [B, K, S, H] at every step. Measured 2026-11-29 on the
# 2-core CPU in zoo.engine's decode chunk, SmolLM2-135M, 128 slots, summing each op's least time in a step
# (load 3-6): at 32 rows the copies were 33.6 of 186.4 ms, the attention with them and the output projection
# (which the value sum fuses into) 63.0 against 48.1 ms, the step 186.4 against 166.4 ms (whole steps' median
# 1.09x); at 8 rows 14.7 against 14.9 ms, even (whole steps' median 1.04x, and 0.95-1.24x at load 8-10); at 1 row
# the sums cost more (attention with its cache write 3.3 against 1.9 ms): the dots below DECODE_REDUCE_ROWS rows.
DECODE_REDUCE_ROWS = 8
NEG_LARGE = -1e30  # a masked logit: finite, so a row with every key masked stays finite (uniform)


def einsum_attention(q_BTNH, k_BSKH, v_BSKH, bias=None, mask=None, *, scale=None, is_causal=False,
                     weights=False, softcap: float = 0.0):
    """softmax(q k^T * scale + bias, masked) v, as plain einsums: zoo's attention on CPU.

    Cheaper than jax.nn.dot_product_attention's XLA path on CPU: the scale goes on q ([B, T, N, H])
    rather than the logits ([B, N, T, S]), the row maximum is a constant for autodiff (it cancels),
    and the softmax is normalised after the value product, on [B, T, N, H], not on [B, N, T, S].
    Grouped keys/values (K < N heads) with few queries (decoding: T <= GROUPED_QUERIES) are read as they are,
    each by its G = N / K query heads (q seen as [B, T, K, G, H]): repeating them to N heads copied the whole KV
    cache G times per layer per decoding step. With more queries they are repeated, which XLA:CPU runs faster
    (see GROUPED_QUERIES). With `weights`, returns (out_BTNH, w_BNTS):
    the softmax rows too (float32; exactly 0 on a masked key of a row that sees any key), the output
    computed as without. `softcap` > 0 bounds the scaled logits to cap * tanh(s / cap) before bias and
    mask (Gemma 2's attention soft-capping).
    """
    B, T, N, H = q_BTNH.shape
    S, K = k_BSKH.shape[1], k_BSKH.shape[2]
    G = N // K  # query heads per key/value head: head n reads key/value head n // G, as jnp.repeat would give it
    scale = H ** -0.5 if scale is None else scale
    if is_causal:
        causal_TS = jnp.arange(S)[None, :] <= jnp.arange(T)[:, None]  # as jax.nn.dot_product_attention
        mask = causal_TS if mask is None else mask & causal_TS
    group = G > 1 and T <= GROUPED_QUERIES
    if group:  # the query heads of one key/value head as an axis of their own: [B, K, G, T, S] scores
        q_x, qk, pv = q_BTNH.reshape(B, T, K, G, H), "BTKGH,BSKH->BKGTS", "BKGTS,BSKH->BTKGH"
        k_x, v_x = k_BSKH, v_BSKH
    else:
        if G > 1:  # many queries (training, prefill): the repeat's copy is small beside the score products
            k_BSKH, v_BSKH = (jnp.repeat(x, G, axis=2) for x in (k_BSKH, v_BSKH))
        # Heads moved before positions first ([B, N, T, H]): both products are then plain batched GEMMs. Read in
        # place, XLA:CPU ran the value product as [B, N, H, T] and transposed it back (2026-11-30, this 2-core CPU:
        # MiniLM's attention at [32, 256, 12, 32] 307 -> 131 ms; causal [8, 256, 12, 64] forward 82 -> 50 ms,
        # with its backward 166 -> 96 ms).
        q_x, k_x, v_x = (x.swapaxes(1, 2) for x in (q_BTNH, k_BSKH, v_BSKH))
        qk, pv = "BNTH,BNSH->BNTS", "BNTS,BNSH->BNTH"
    step = group and T == 1 and B >= DECODE_REDUCE_ROWS
    if step:  # one query per row: products and sums over the cache as it lies, [B, S, K, G, H]
        q_B1KGH = (q_BTNH.reshape(B, 1, K, G, H) * jnp.asarray(scale, q_BTNH.dtype)).astype(jnp.float32)
        s_BSKG = jnp.sum(q_B1KGH * k_BSKH.astype(jnp.float32)[:, :, :, None, :], -1)
        s_x = soft_cap(jnp.transpose(s_BSKG, (0, 2, 3, 1))[:, :, :, None, :], softcap)  # [B, K, G, 1, S]
    else:
        s_x = soft_cap(einsum_f32(qk, q_x * jnp.asarray(scale, q_BTNH.dtype), k_x), softcap)
    if bias is not None:
        s_x = s_x + (_grouped(bias, K, G) if group else bias).astype(jnp.float32)
    if mask is not None:
        s_x = jnp.where(_grouped(mask, K, G) if group else mask, s_x, NEG_LARGE)
    e_x = jnp.exp(s_x - jax.lax.stop_gradient(jnp.max(s_x, -1, keepdims=True)))
    if step:
        e_BSKG1 = jnp.transpose(e_x[:, :, :, 0, :], (0, 3, 1, 2))[..., None]
        out_x = jnp.sum(e_BSKG1 * v_BSKH.astype(jnp.float32)[:, :, :, None, :], 1)[:, None]  # [B, 1, K, G, H]
    else:
        out_x = einsum_f32(pv, e_x.astype(v_x.dtype), v_x)
    sum_x = jnp.sum(e_x, -1)  # [B, K, G, T] or [B, N, T]
    if group:
        sum_xT = jnp.moveaxis(sum_x, -1, 1)[..., None]  # the query axis second, as in the output
        out_BTNH = (out_x / sum_xT).reshape(B, T, N, H).astype(q_BTNH.dtype)
    else:  # out_x is [B, N, T, H]
        out_BTNH = (out_x / sum_x[..., None]).swapaxes(1, 2).astype(q_BTNH.dtype)
    if weights:  # exp(NEG_LARGE - a real row maximum) is exactly 0: a masked key weighs 0
        return out_BTNH, (e_x / sum_x[..., None]).reshape(B, N, T, S)
    return out_BTNH


def _grouped(x, K: int, G: int):
    """A bias or mask broadcastable to [B, N, T, S] as one broadcastable to [B, K, G, T, S] (head n = k * G + g)."""
    x = jnp.asarray(x)
    x = x.reshape((1,) * (4 - x.ndim) + x.shape)
    if x.shape[1] == 1:
        return x[:, :, None]
    return x.reshape(x.shape[0], K, G, *x.shape[2:])


def attention(q_BTNH, k_BSKH, v_BSKH, bias=None, mask=None, *, scale=None, is_causal=False, implementation=None,
              training=True, segment_ids_BT=None, softcap: float = 0.0, window: int = 0, local=None):
    """einsum_attention, jax.nn.dot_product_attention or splash attention, as `select_backend` says. `training`
    False (decoding: no gradient) lets `auto` take cuDNN at odd lengths. `segment_ids_BT` (packed examples,
    self-attention) keeps each query within its own example: cuDNN's packed layout on cuDNN, splash's segment
    ids on splash, else a segment mask. `window` > 0 (self-attention; unless `local` is False, see
    `window_mask`): a query sees only keys less than `window` positions back. `softcap` > 0 (logit
    soft-capping) runs in splash; neither of jax.nn.dot_product_attention's backends computes it, so elsewhere
    it runs einsum_attention (plain XLA ops on every platform): auto and xla say so once in the log, cudnn is
    refused."""
    if resolve_attention(implementation) == "splash":
        backend = select_backend(implementation, q_BTNH, k_BSKH, v_BSKH, bias, mask, is_causal=is_causal,
                                 training=training)
        if backend == "splash":
            return tpu_kernels.splash_attention(q_BTNH, k_BSKH, v_BSKH, scale=scale, is_causal=is_causal,
                                                segment_ids_BT=segment_ids_BT, window=window, local=local,
                                                softcap=softcap)
        implementation = backend  # xla, the reason logged once
    if window and local is not False:
        window_11TS = window_mask(q_BTNH.shape[1], k_BSKH.shape[1], window, local)
        mask = window_11TS if mask is None else mask & window_11TS
    if softcap:
        if implementation == "cudnn":
            raise ValueError("model.attention_impl=cudnn cannot soft-cap attention logits (model.attn_softcap); "
                             "use auto, xla or einsum")
        if resolve_attention(implementation) != "einsum":
            note_fallback("attention soft-capping runs zoo's einsum attention (jax.nn.dot_product_attention "
                          "cannot cap logits)")
        if segment_ids_BT is not None:
            same_B1TT = segment_mask(segment_ids_BT)
            mask = same_B1TT if mask is None else mask & same_B1TT
        return einsum_attention(q_BTNH, k_BSKH, v_BSKH, bias, mask, scale=scale, is_causal=is_causal,
                                softcap=softcap)
    backend = select_backend(implementation, q_BTNH, k_BSKH, v_BSKH, bias, mask, is_causal=is_causal,
                             training=training)
    if segment_ids_BT is not None:
        if backend == "cudnn":
            return _cudnn_packed(q_BTNH, k_BSKH, v_BSKH, bias, mask, segment_ids_BT, scale=scale, is_causal=is_causal,
                                 fallback=implementation in (None, "auto"))
        same_B1TT = segment_mask(segment_ids_BT)
        mask = same_B1TT if mask is None else mask & same_B1TT
    if backend == "einsum":
        return einsum_attention(q_BTNH, k_BSKH, v_BSKH, bias, mask, scale=scale, is_causal=is_causal)
    if backend == "cudnn":
        return _cudnn(q_BTNH, k_BSKH, v_BSKH, bias, mask, scale=scale, is_causal=is_causal,
                      fallback=implementation in (None, "auto"))
    return jax.nn.dot_product_attention(q_BTNH, k_BSKH, v_BSKH, bias=bias, mask=mask, scale=scale,
                                        is_causal=is_causal, implementation=backend)


def _cudnn(q_BTNH, k_BSKH, v_BSKH, bias, mask, *, scale, is_causal, fallback):
    """cuDNN flash attention: the mask's length axes broadcast to [T, S] (cuDNN takes it as a full-length
    bias), the bias in the compute dtype. With `fallback` (auto), a shape jax's cuDNN checks still refuse
    at trace time runs XLA instead, the reason logged once."""
    T, S = q_BTNH.shape[1], k_BSKH.shape[1]
    cmask = None
    if mask is not None:
        mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
        cmask = jnp.broadcast_to(mask, mask.shape[:2] + (T, S))
    cbias = None if bias is None else bias.astype(q_BTNH.dtype)
    try:
        return jax.nn.dot_product_attention(q_BTNH, k_BSKH, v_BSKH, bias=cbias, mask=cmask, scale=scale,
                                            is_causal=is_causal, implementation="cudnn")
    except (NotImplementedError, ValueError, RuntimeError) as e:
        if not fallback:
            raise
        note_fallback(f"jax's cuDNN checks: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    return jax.nn.dot_product_attention(q_BTNH, k_BSKH, v_BSKH, bias=bias, mask=mask, scale=scale,
                                        is_causal=is_causal, implementation="xla")


def _cudnn_packed(q_BTNH, k_BTKH, v_BTKH, bias, mask, segment_ids_BT, *, scale, is_causal, fallback):
    """Packed examples on cuDNN flash attention: its packed layout (each example's length and offset) with a
    padding(-causal) mask, no [B, T, T] mask built. What it cannot take (a bias or another mask, a jax whose
    cuDNN checks refuse it) runs XLA with the segment mask instead (auto: the reason logged once)."""
    reason = "a bias or mask beside packed examples" if bias is not None or mask is not None else None
    if reason is None:
        try:
            from jax._src.cudnn import fused_attention_stablehlo as fa
            seqlen_BM, offsets_BM1 = packed_layout(segment_ids_BT, segment_ids_BT.shape[1])
            H = q_BTNH.shape[-1]
            return fa.dot_product_attention(
                q_BTNH, k_BTKH, v_BTKH, None, None, seqlen_BM, seqlen_BM, offsets_BM1, offsets_BM1,
                scale=H ** -0.5 if scale is None else scale, qkv_layout="BTNH",
                mask_type=fa.MaskType.PADDING_CAUSAL if is_causal else fa.MaskType.PADDING)
        except (ImportError, AttributeError, TypeError, NotImplementedError, ValueError, RuntimeError) as e:
            if not fallback:
                raise
            reason = f"jax's packed cuDNN attention: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if not fallback:
        raise ValueError(f"model.attention_impl=cudnn cannot run packed examples here: {reason}")
    note_fallback(f"packed examples: {reason}")
    same_B1TT = segment_mask(segment_ids_BT)
    return jax.nn.dot_product_attention(q_BTNH, k_BTKH, v_BTKH, bias=bias, mask=same_B1TT if mask is None else
                                        mask & same_B1TT, scale=scale, is_causal=is_causal, implementation="xla")


class Attention(nn.Module):
    """Multi-head attention: zoo's einsum softmax on CPU, jax.nn.dot_product_attention elsewhere
    (cuDNN flash attention on GPU, splash attention on TPU, where the shapes allow), see `attention`.

    Self-attention when `kv_BSD` is None, cross-attention otherwise. With `decode=True` keys and
    values are written into a cache (collection "cache", length fixed when the cache is created)
    at `positions_T` (or per row at `positions_BT`, a negative position marking left padding, not cached),
    and queries attend the cache; a cross-attention's keys and values of `kv_BSD`
    are cached whole by the call that creates the cache. `bias_BNTS` (broadcastable) is added to the
    logits, e.g. T5's relative position bias.

    Only when the caller applies the model with the "intermediates" collection mutable (zoo-attention)
    does the module run `einsum_attention` whatever the backend and sow its softmax rows as
    `attention_weights` (w_BNTS, float32). Training and decoding never make it mutable, so their traced
    (and jitted) computation is the plain one.
    """

    num_heads: int
    head_dim: int
    num_kv_heads: int | None = None  # K key/value heads (grouped-query attention); None: N
    out_std: float = 0.02  # residual projection init (scaled by the caller)
    use_bias: bool = True  # biases on the query, key and value projections
    out_bias: bool | None = None  # bias on the output projection; None: as use_bias
    rope: Rope | None = None  # rotary positions applied to queries and keys (self-attention)
    sliding_window: int = 0  # > 0: a query sees only the last `sliding_window` keys (Mistral)
    scale: float | None = None  # logits scale; None: 1/sqrt(H) (T5 folds it into the init: 1.0)
    qk_norm_eps: float | None = None  # RMSNorm of this eps (`q_norm`, `k_norm`, weight [H]) on each query and
    #   key head before rope (Qwen3); None: none
    # Gemma: (1 + w) q/k norms (Gemma 3), logit soft-capping (Gemma 2), and local layers (called with
    # `local`) whose rotary base differs (Gemma 3's rope_local_base_freq).
    qk_norm_plus1: bool = False  # the q/k norms scale by (1 + w), w initialised to zeros
    softcap: float = 0.0  # > 0: logits cap * tanh(logits / cap) (splash on TPU, else zoo's einsum attention); 0: off
    rope_local: Rope | None = None  # rotary positions of local (sliding-window) calls; None: `rope`
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    implementation: str | None = None  # model.attention_impl: auto (or None) | xla | cudnn | einsum | splash

    def _proj(self, name, features, heads, x):
        return Einsum((features, heads, self.head_dim), ("embed", "heads", "kv"), "BTD,DNH->BTNH",
                      bias_axes=("heads", "kv") if self.use_bias else None,
                      dtype=self.dtype, param_dtype=self.param_dtype, name=name)(x)

    @nn.compact
    def __call__(self, x_BTD, mask_B1TS=None, *, kv_BSD=None, is_causal=False, decode=False,
                 positions_T=None, bias_BNTS=None, segment_ids_BT=None, local=None, value_embed_BTKH=None):
        """`local` (alternating local/global layers): None, every call windowed when sliding_window > 0; a
        Python bool, or a traced bool scalar (a scanned stack), whether this layer is windowed (and rotates
        with `rope_local`). `value_embed_BTKH` (self-attention; modded-nanogpt's value embeddings): the values
        become l0 v + l1 value_embed, l (`value_lambdas`) learned and initialised to 0.5 each."""
        D = x_BTD.shape[-1]
        K = self.num_kv_heads or self.num_heads
        if kv_BSD is None and self.has_variable("params", "qkv_t"):  # decode_layout: query, key, value as one product
            N, H = self.num_heads, self.head_dim
            q, k, v = fused_t(self, "qkv", x_BTD, (N * H, K * H, K * H))
            q_BTNH, k_BSKH, v_BSKH = (a.reshape(*a.shape[:2], n, H) for a, n in ((q, N), (k, K), (v, K)))
        elif decode and kv_BSD is not None:
            q_BTNH = self._proj("query", D, self.num_heads, x_BTD)
            k_BSKH, v_BSKH = self._cross_cache(kv_BSD, K)
        else:
            q_BTNH = self._proj("query", D, self.num_heads, x_BTD)
            src_BSD = x_BTD if kv_BSD is None else kv_BSD
            k_BSKH = self._proj("key", src_BSD.shape[-1], K, src_BSD)
            v_BSKH = self._proj("value", src_BSD.shape[-1], K, src_BSD)
        if value_embed_BTKH is not None:
            lambdas = self.param("value_lambdas", nn.with_logical_partitioning(nn.initializers.constant(0.5), (None,)),
                                 (2,), self.param_dtype).astype(self.dtype)
            v_BSKH = lambdas[0] * v_BSKH + lambdas[1] * value_embed_BTKH.astype(self.dtype)
        if self.qk_norm_eps is not None:  # over H, per head and position: the same weight for every head
            kw = dict(dtype=self.dtype, param_dtype=self.param_dtype, axis="kv")
            qk_norm = rms_norm_plus1 if self.qk_norm_plus1 else rms_norm
            q_BTNH = qk_norm(self.qk_norm_eps, name="q_norm", **kw)(q_BTNH)
            k_BSKH = qk_norm(self.qk_norm_eps, name="k_norm", **kw)(k_BSKH)
        if self.rope is not None:
            positions_T = jnp.arange(x_BTD.shape[1]) if positions_T is None else positions_T
            q_BTNH, k_BSKH = self._rotate(q_BTNH, positions_T, local), self._rotate(k_BSKH, positions_T, local)
        if decode and kv_BSD is None:
            window = self.sliding_window if local is not False else 0  # a step by a kernel (paged, dense)
            if (out_BTNH := paged_kernels.decode_step(self, q_BTNH, k_BSKH, v_BSKH, positions_T, mask=mask_B1TS,
                                                      bias=bias_BNTS, window=window)) is not None:
                return self._out(D, out_BTNH)
            given_B1TS = mask_B1TS  # the caller's, before the cache's own
            k_BSKH, v_BSKH, mask_B1TS = self._update_cache(k_BSKH, v_BSKH, positions_T, mask_B1TS)
            if paged_cache.current() is None and (out_BTNH := cpu_kernels.decode_step(
                    self, q_BTNH, k_BSKH, v_BSKH, positions_T, mask=given_B1TS, bias=bias_BNTS,
                    window=window)) is not None:  # a dense cache's step on a CPU: zoo's kernel (zoo.nn.cpu_kernels)
                return self._out(D, out_BTNH)
            is_causal = False
        # A window (not on a global layer, local False): without a cache, index distances (packed rows' positions
        # restart per example, but within one they are index distances), applied by `attention` (splash takes it
        # as such); decoding caches each row at its own positions (slots), so those are the distances
        window = self.sliding_window if not decode and kv_BSD is None and local is not False else 0
        if self.sliding_window and local is not False and not window:
            q_xT = positions_T if positions_T is not None and (positions_T.ndim == 1 or decode) else \
                jnp.arange(x_BTD.shape[1])
            q_x1T1 = q_xT[None, None, :, None] if q_xT.ndim == 1 else q_xT[:, None, :, None]
            window_x1TS = q_x1T1 - jnp.arange(k_BSKH.shape[1]) < self.sliding_window
            if local is not None and local is not True:  # traced (scanned layers): global layers see every key
                window_x1TS = window_x1TS | jnp.logical_not(local)
            mask_B1TS = window_x1TS if mask_B1TS is None else mask_B1TS & window_x1TS
        if self.is_mutable_collection("intermediates"):  # asked for the weights: decided while tracing
            if segment_ids_BT is not None:
                same_B1TT = segment_mask(segment_ids_BT)
                mask_B1TS = same_B1TT if mask_B1TS is None else mask_B1TS & same_B1TT
            if window:
                window_11TS = window_mask(x_BTD.shape[1], k_BSKH.shape[1], window, local)
                mask_B1TS = window_11TS if mask_B1TS is None else mask_B1TS & window_11TS
            out_BTNH, w_BNTS = einsum_attention(q_BTNH, k_BSKH, v_BSKH, bias_BNTS, mask_B1TS, scale=self.scale,
                                                is_causal=is_causal, weights=True, softcap=self.softcap)
            self.sow("intermediates", "attention_weights", w_BNTS)
        else:
            out_BTNH = attention(q_BTNH, k_BSKH, v_BSKH, bias=bias_BNTS, mask=mask_B1TS, scale=self.scale,
                                 is_causal=is_causal, implementation=self.implementation, training=not decode,
                                 segment_ids_BT=segment_ids_BT, softcap=self.softcap, window=window, local=local)
        return self._out(D, out_BTNH)

    def _out(self, D, out_BTNH):
        return Einsum((self.num_heads, self.head_dim, D), ("heads", "kv", "embed"), "BTNH,NHD->BTD",
                      std=self.out_std,
                      bias_axes=("embed",) if (self.use_bias if self.out_bias is None else self.out_bias) else None,
                      dtype=self.dtype, param_dtype=self.param_dtype, name="out")(out_BTNH)

    def _rotate(self, x_BTNH, positions_T, local):
        """`rope`, or `rope_local` where `local` (a Python bool, or a traced scalar: both computed, one kept)."""
        if self.rope_local is None or local is None or local is False:
            return self.rope(x_BTNH, positions_T)
        if local is True:
            return self.rope_local(x_BTNH, positions_T)
        return jnp.where(local, self.rope_local(x_BTNH, positions_T), self.rope(x_BTNH, positions_T))

    def _cross_cache(self, kv_BSD, K):
        """Cross-attention while decoding: the call that creates the cache projects the encoder output
        once and stores its keys and values; later calls read them (kv_BSD then only gives the shape)."""
        if self.has_variable("cache", "cross_key"):
            return self.get_variable("cache", "cross_key"), self.get_variable("cache", "cross_value")
        k_BSKH = self._proj("key", kv_BSD.shape[-1], K, kv_BSD)
        v_BSKH = self._proj("value", kv_BSD.shape[-1], K, kv_BSD)
        self.put_variable("cache", "cross_key", k_BSKH)
        self.put_variable("cache", "cross_value", v_BSKH)
        return k_BSKH, v_BSKH

    def _update_cache(self, k_BTKH, v_BTKH, positions_T, mask_B1TS):
        initialising = not self.has_variable("cache", "cached_key")
        key = self.variable("cache", "cached_key", jnp.zeros, k_BTKH.shape, k_BTKH.dtype)
        value = self.variable("cache", "cached_value", jnp.zeros, v_BTKH.shape, v_BTKH.dtype)
        if initialising:  # the cache's length is the length of the input it was created with
            return k_BTKH, v_BTKH, mask_B1TS
        if (paged := paged_cache.current()) is not None:  # the pool of pages (zoo.nn.paged_cache)
            k_BSKH, v_BSKH, cmask_B1TS = paged_cache.write_read(key, value, k_BTKH, v_BTKH, positions_T, paged)
            return k_BSKH, v_BSKH, cmask_B1TS if mask_B1TS is None else mask_B1TS & cmask_B1TS
        S = key.value.shape[1]
        if positions_T.ndim == 2:  # per row (left-padded batches): a token goes to the slot of its position
            cmask_B1TS = _write_rows(key, value, k_BTKH, v_BTKH, positions_T)
            return key.value, value.value, cmask_B1TS if mask_B1TS is None else mask_B1TS & cmask_B1TS
        start = (0, positions_T[0], 0, 0)
        key.value = jax.lax.dynamic_update_slice(key.value, k_BTKH.astype(key.value.dtype), start)
        value.value = jax.lax.dynamic_update_slice(value.value, v_BTKH.astype(value.value.dtype), start)
        cmask_11TS = causal_mask(positions_T, S)
        mask_B1TS = cmask_11TS if mask_B1TS is None else mask_B1TS & cmask_11TS
        return key.value, value.value, mask_B1TS


def _write_rows(key, value, k_BTKH, v_BTKH, positions_BT):
    """Cache each row's keys and values at the slots of its own positions; a negative position (left padding)
    is written nowhere. Returns mask_B1TS: a query sees the slots at or before its position (a padding
    query sees none; its output, uniform over the cache, is finite and unused)."""
    S = key.value.shape[1]
    slots_BT = jnp.where(positions_BT >= 0, positions_BT, S)  # S is out of range: dropped
    rows_B1 = jnp.arange(positions_BT.shape[0])[:, None]
    key.value = key.value.at[rows_B1, slots_BT].set(k_BTKH.astype(key.value.dtype), mode="drop")
    value.value = value.value.at[rows_B1, slots_BT].set(v_BTKH.astype(value.value.dtype), mode="drop")
    return (jnp.arange(S)[None, None, :] <= positions_BT[:, :, None])[:, None]
