"""Attention: masks, the backend choice per platform, and the multi-head `Attention` module.

`attention()` is the one entry point: zoo's einsum softmax (`einsum_attention`) on CPU, or
`jax.nn.dot_product_attention` with the backend `model.attention_impl` names (see
`resolve_attention`). Masks are boolean, True = may attend, shaped [B, 1, T, S] (broadcastable).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.nn.layers import Dtype, Einsum

# model.attention_impl: einsum is zoo's own softmax attention, what `auto` runs on CPU; xla and cudnn are
# jax.nn.dot_product_attention's backends (cudnn: flash attention on NVIDIA GPUs).
IMPLEMENTATIONS = ("auto", "xla", "cudnn", "einsum")


def causal_mask(positions_T, length: int):
    """mask_11TS: query at absolute position p may attend keys 0..p (cached decoding)."""
    return (jnp.arange(length)[None, :] <= positions_T[:, None])[None, None]


def padding_mask(valid_BS, valid_BT=None):
    """mask_B1TS from key validity (and optionally query validity): True = may attend."""
    valid_BT = valid_BS if valid_BT is None else valid_BT
    return valid_BT[:, None, :, None] & valid_BS[:, None, None, :]


NEG_LARGE = -1e30  # a masked logit: finite, so a row with every key masked stays finite (uniform)


def einsum_attention(q_BTNH, k_BSKH, v_BSKH, bias=None, mask=None, *, scale=None, is_causal=False):
    """softmax(q k^T * scale + bias, masked) v, as plain einsums: zoo's attention on CPU.

    Cheaper than jax.nn.dot_product_attention's XLA path on CPU: the scale goes on q ([B, T, N, H])
    rather than the logits ([B, N, T, S]), the row maximum is a constant for autodiff (it cancels),
    and the softmax is normalised after the value product, on [B, T, N, H], not on [B, N, T, S].
    Grouped keys/values (K < N heads) are repeated to N.
    """
    B, T, N, H = q_BTNH.shape
    S, K = k_BSKH.shape[1], k_BSKH.shape[2]
    if K != N:
        k_BSKH, v_BSKH = (jnp.repeat(x, N // K, axis=2) for x in (k_BSKH, v_BSKH))
    scale = H ** -0.5 if scale is None else scale
    s_BNTS = jnp.einsum("BTNH,BSNH->BNTS", q_BTNH * jnp.asarray(scale, q_BTNH.dtype), k_BSKH,
                        preferred_element_type=jnp.float32)
    if bias is not None:
        s_BNTS = s_BNTS + bias.astype(jnp.float32)
    if is_causal:
        causal_TS = jnp.arange(S)[None, :] <= jnp.arange(T)[:, None]  # as jax.nn.dot_product_attention
        mask = causal_TS if mask is None else mask & causal_TS
    if mask is not None:
        s_BNTS = jnp.where(mask, s_BNTS, NEG_LARGE)
    e_BNTS = jnp.exp(s_BNTS - jax.lax.stop_gradient(jnp.max(s_BNTS, -1, keepdims=True)))
    out_BTNH = jnp.einsum("BNTS,BSNH->BTNH", e_BNTS.astype(v_BSKH.dtype), v_BSKH, preferred_element_type=jnp.float32)
    return (out_BTNH / jnp.sum(e_BNTS, -1).transpose(0, 2, 1)[..., None]).astype(q_BTNH.dtype)


def resolve_attention(implementation: str | None) -> str | None:
    """The backend `attention` runs for model.attention_impl: "einsum" for "einsum", and for "auto" (or
    None) on CPU; otherwise the name passed to jax.nn.dot_product_attention (None: its own pick, cuDNN
    flash attention on a GPU when the shapes allow)."""
    if implementation in (None, "auto"):
        return "einsum" if jax.default_backend() == "cpu" else None
    return implementation


def attention(q_BTNH, k_BSKH, v_BSKH, bias=None, mask=None, *, scale=None, is_causal=False, implementation=None):
    """einsum_attention or jax.nn.dot_product_attention, as `resolve_attention(implementation)` says."""
    implementation = resolve_attention(implementation)
    if implementation == "einsum":
        return einsum_attention(q_BTNH, k_BSKH, v_BSKH, bias, mask, scale=scale, is_causal=is_causal)
    return jax.nn.dot_product_attention(q_BTNH, k_BSKH, v_BSKH, bias=bias, mask=mask, scale=scale,
                                        is_causal=is_causal, implementation=implementation)


class Attention(nn.Module):
    """Multi-head attention: zoo's einsum softmax on CPU, jax.nn.dot_product_attention elsewhere
    (cuDNN flash on GPU), see `attention`.

    Self-attention when `kv_BSD` is None, cross-attention otherwise. With `decode=True` keys and
    values are written into a cache (collection "cache", length fixed when the cache is created)
    at `positions_T`, and queries attend the cache; a cross-attention's keys and values of `kv_BSD`
    are cached whole by the call that creates the cache. `bias_BNTS` (broadcastable) is added to the
    logits, e.g. T5's relative position bias.
    """

    num_heads: int
    head_dim: int
    num_kv_heads: int | None = None
    out_std: float = 0.02  # residual projection init (scaled by the caller)
    use_bias: bool = True
    scale: float | None = None  # logits scale; None: 1/sqrt(H) (T5 folds it into the init: 1.0)
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    implementation: str | None = None  # model.attention_impl: auto (or None) | xla | cudnn | einsum

    def _proj(self, name, features, heads, x):
        return Einsum((features, heads, self.head_dim), ("embed", "heads", "kv"), "BTD,DNH->BTNH",
                      bias_axes=("heads", "kv") if self.use_bias else None,
                      dtype=self.dtype, param_dtype=self.param_dtype, name=name)(x)

    @nn.compact
    def __call__(self, x_BTD, mask_B1TS=None, *, kv_BSD=None, is_causal=False, decode=False,
                 positions_T=None, bias_BNTS=None):
        D = x_BTD.shape[-1]
        K = self.num_kv_heads or self.num_heads
        q_BTNH = self._proj("query", D, self.num_heads, x_BTD)
        if decode and kv_BSD is not None:
            k_BSKH, v_BSKH = self._cross_cache(kv_BSD, K)
        else:
            src_BSD = x_BTD if kv_BSD is None else kv_BSD
            k_BSKH = self._proj("key", src_BSD.shape[-1], K, src_BSD)
            v_BSKH = self._proj("value", src_BSD.shape[-1], K, src_BSD)
        if decode and kv_BSD is None:
            k_BSKH, v_BSKH, mask_B1TS = self._update_cache(k_BSKH, v_BSKH, positions_T, mask_B1TS)
            is_causal = False
        out_BTNH = attention(q_BTNH, k_BSKH, v_BSKH, bias=bias_BNTS, mask=mask_B1TS, scale=self.scale,
                             is_causal=is_causal, implementation=self.implementation)
        return Einsum((self.num_heads, self.head_dim, D), ("heads", "kv", "embed"), "BTNH,NHD->BTD",
                      std=self.out_std, bias_axes=("embed",) if self.use_bias else None,
                      dtype=self.dtype, param_dtype=self.param_dtype, name="out")(out_BTNH)

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
        start = (0, positions_T[0], 0, 0)
        key.value = jax.lax.dynamic_update_slice(key.value, k_BTKH.astype(key.value.dtype), start)
        value.value = jax.lax.dynamic_update_slice(value.value, v_BTKH.astype(value.value.dtype), start)
        S = key.value.shape[1]
        cmask_11TS = causal_mask(positions_T, S)
        mask_B1TS = cmask_11TS if mask_B1TS is None else mask_B1TS & cmask_11TS
        return key.value, value.value, mask_B1TS

