"""Pieces that two or more model families share: embeddings, attention, MLP, blocks, norms, positions, masks.

Dimension key (used in every einsum string and shape suffix in zoo):
  B batch          T query length      S key/source length
  D model width    F MLP hidden width  N query heads    K key/value heads    H head dim
  V vocabulary     L layers            C classes

Kernels keep their natural axes (`[D, N, H]`) and are applied with letter einsums. Every parameter
carries logical axis names (`batch, length, embed, mlp, heads, kv, vocab`, and `layers` for scanned
stacks); `zoo.sharding` maps them to mesh axes. Nothing here knows which family uses it.
"""

from __future__ import annotations

import math
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

Dtype = jnp.dtype


def normal(std: float, axes: tuple) -> Callable:
    """Normal(0, std) initializer tagged with logical axis names."""
    return nn.with_logical_partitioning(nn.initializers.normal(std), axes)


def zeros(axes: tuple) -> Callable:
    return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def ones(axes: tuple) -> Callable:
    return nn.with_logical_partitioning(nn.initializers.ones_init(), axes)


def constrain(x, axes: tuple):
    """Activation sharding hint at a block boundary (a no-op outside a mesh context)."""
    return nn.with_logical_constraint(x, axes)


class Einsum(nn.Module):
    """A weight of a given shape applied by one einsum; optional bias over the output's trailing axes."""

    shape: tuple
    axes: tuple  # logical names of the weight's axes
    eqn: str
    std: float = 0.02
    bias_axes: tuple | None = None  # logical names of the bias (the output's trailing axes); None: no bias
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        w = self.param("kernel", normal(self.std, self.axes), self.shape, self.param_dtype)
        y = jnp.einsum(self.eqn, x.astype(self.dtype), w.astype(self.dtype))
        if self.bias_axes is not None:
            bias_shape = self.shape[-len(self.bias_axes):]
            b = self.param("bias", zeros(self.bias_axes), bias_shape, self.param_dtype)
            y = y + b.astype(self.dtype)
        return y


class Embed(nn.Module):
    """Token embedding [V, D]; `attend` reuses it as the tied output projection."""

    vocab_size: int
    features: int
    std: float = 0.02
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    def setup(self):
        self.embedding = self.param("embedding", normal(self.std, ("vocab", "embed")),
                                    (self.vocab_size, self.features), self.param_dtype)

    def __call__(self, ids_BT):
        return jnp.take(self.embedding, ids_BT, axis=0).astype(self.dtype)

    def attend(self, x_BTD):
        # Logits in float32 whatever the compute dtype: softmax and loss need the range.
        return jnp.einsum("BTD,VD->BTV", x_BTD.astype(self.dtype), self.embedding.astype(self.dtype),
                          preferred_element_type=jnp.float32)


def layer_norm(eps: float, dtype, param_dtype, name: str) -> nn.LayerNorm:
    return nn.LayerNorm(epsilon=eps, dtype=dtype, param_dtype=param_dtype, name=name,
                        scale_init=ones(("embed",)), bias_init=zeros(("embed",)))


def rms_norm(eps: float, dtype, param_dtype, name: str) -> nn.RMSNorm:
    """Scale-only norm without mean subtraction or bias (T5)."""
    return nn.RMSNorm(epsilon=eps, dtype=dtype, param_dtype=param_dtype, name=name, scale_init=ones(("embed",)))


def sinusoidal_positions(positions_T, features: int):
    """pos_TD (float32), Vaswani et al.: sin(p / 10000^(2i/D)) on the first half of D, cos on the second."""
    inv_freq = jnp.exp(-math.log(10000.0) * jnp.arange(0, features, 2) / features)  # [D/2]
    angle = positions_T.astype(jnp.float32)[:, None] * inv_freq[None]  # [T, D/2]
    return jnp.concatenate([jnp.sin(angle), jnp.cos(angle)], axis=-1)


def relative_position_bucket(relative_TS, bidirectional: bool, num_buckets: int, max_distance: int):
    """T5's bucket of each (key - query) offset: one bucket per offset below num_buckets / 2 (per
    direction), then log-spaced buckets up to max_distance, the last one holding everything beyond."""
    bucket_TS = jnp.zeros_like(relative_TS)
    if bidirectional:
        num_buckets //= 2
        bucket_TS = bucket_TS + (relative_TS > 0) * num_buckets
        n_TS = jnp.abs(relative_TS)
    else:  # the decoder only sees keys at or before the query
        n_TS = jnp.maximum(-relative_TS, 0)
    exact = num_buckets // 2
    # max(n, 1): log(0) is -inf; those offsets take the exact branch anyway.
    log_ratio_TS = jnp.log(jnp.maximum(n_TS, 1) / exact) / math.log(max_distance / exact)
    large_TS = jnp.minimum(exact + (log_ratio_TS * (num_buckets - exact)).astype(jnp.int32), num_buckets - 1)
    return bucket_TS + jnp.where(n_TS < exact, n_TS, large_TS)


class RelativePositionBias(nn.Module):
    """T5 relative attention bias: a learned scalar per (offset bucket, head), shared by all layers."""

    num_heads: int
    num_buckets: int = 32
    max_distance: int = 128
    bidirectional: bool = True
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, q_positions_T, k_positions_S):
        table = self.param("embedding", normal(0.02, (None, "heads")), (self.num_buckets, self.num_heads),
                           self.param_dtype)  # [buckets, N]
        bucket_TS = relative_position_bucket(k_positions_S[None, :] - q_positions_T[:, None], self.bidirectional,
                                             self.num_buckets, self.max_distance)
        bias_TSN = jnp.take(table, bucket_TS, axis=0).astype(jnp.float32)
        return jnp.moveaxis(bias_TSN, -1, 0)[None]  # bias_1NTS


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


class Mlp(nn.Module):
    """Two-layer feed-forward: D -> F (activation) -> D."""

    d_ff: int
    activation: Callable = nn.gelu
    out_std: float = 0.02
    use_bias: bool = True
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x_BTD):
        D = x_BTD.shape[-1]
        h_BTF = Einsum((D, self.d_ff), ("embed", "mlp"), "BTD,DF->BTF",
                       bias_axes=("mlp",) if self.use_bias else None,
                       dtype=self.dtype, param_dtype=self.param_dtype, name="fc")(x_BTD)
        h_BTF = constrain(self.activation(h_BTF), ("batch", "length", "mlp"))
        return Einsum((self.d_ff, D), ("mlp", "embed"), "BTF,FD->BTD", std=self.out_std,
                      bias_axes=("embed",) if self.use_bias else None,
                      dtype=self.dtype, param_dtype=self.param_dtype, name="proj")(h_BTF)


class GatedMlp(nn.Module):
    """Gated feed-forward (GEGLU, T5 v1.1): D -> act(x W_gate) * (x W_fc) -> D, no biases."""

    d_ff: int
    activation: Callable = nn.gelu
    out_std: float = 0.02
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x_BTD):
        D = x_BTD.shape[-1]
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        gate_BTF = Einsum((D, self.d_ff), ("embed", "mlp"), "BTD,DF->BTF", name="gate", **kw)(x_BTD)
        h_BTF = Einsum((D, self.d_ff), ("embed", "mlp"), "BTD,DF->BTF", name="fc", **kw)(x_BTD)
        h_BTF = constrain(self.activation(gate_BTF) * h_BTF, ("batch", "length", "mlp"))
        return Einsum((self.d_ff, D), ("mlp", "embed"), "BTF,FD->BTD", std=self.out_std, name="proj", **kw)(h_BTF)


def gelu_tanh(x):
    """GELU with the tanh approximation, as GPT-2 and BERT's TF checkpoints were trained."""
    return jax.nn.gelu(x, approximate=True)


class PreLnBlock(nn.Module):
    """x + Attn(LN(x)); x + Mlp(LN(x)) (GPT-2). Returns (x, None) when scanned over layers."""

    num_heads: int
    d_ff: int
    dropout: float
    ln_eps: float
    out_std: float  # init std of the two residual projections
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    implementation: str | None = None
    scanned: bool = False

    @nn.compact
    def __call__(self, x_BTD, mask_B1TS, deterministic: bool, decode: bool, positions_T=None):
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        D = x_BTD.shape[-1]
        h = layer_norm(self.ln_eps, name="ln_1", **kw)(x_BTD)
        h = Attention(self.num_heads, D // self.num_heads, out_std=self.out_std,
                      implementation=self.implementation, name="attn", **kw)(
            h, mask_B1TS, is_causal=mask_B1TS is None, decode=decode, positions_T=positions_T)
        x_BTD = x_BTD + nn.Dropout(self.dropout)(h, deterministic=deterministic)
        h = layer_norm(self.ln_eps, name="ln_2", **kw)(x_BTD)
        h = Mlp(self.d_ff, gelu_tanh, out_std=self.out_std, name="mlp", **kw)(h)
        x_BTD = x_BTD + nn.Dropout(self.dropout)(h, deterministic=deterministic)
        x_BTD = constrain(x_BTD, ("batch", "length", "embed"))
        return (x_BTD, None) if self.scanned else x_BTD


# zoo.config.REMAT_POLICIES -> the jax.checkpoint policy (None: save nothing, recompute the whole block).
REMAT_POLICIES = {"full": None, "dots": jax.checkpoint_policies.dots_saveable,
                  "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


def stack_blocks(block_cls, num_layers: int, *, scan: bool, remat: bool, name: str, remat_policy: str = "full",
                 **block_kw):
    """L blocks as a Python loop (params h_0..h_{L-1}) or as one nn.scan (params h[L, ...]).

    Returns a callable (x, *args) -> x. Positional args after x are broadcast to every layer.
    """
    cls = block_cls
    if remat:
        # deterministic and decode (args 3, 4 counting self) are Python bools: static.
        cls = nn.remat(cls, static_argnums=(3, 4), prevent_cse=not scan, policy=REMAT_POLICIES[remat_policy])
    if scan:
        stack = nn.scan(cls, variable_axes={"params": 0, "cache": 0}, split_rngs={"params": True, "dropout": True},
                        in_axes=nn.broadcast, length=num_layers,
                        metadata_params={nn.PARTITION_NAME: "layers"})(scanned=True, name=name, **block_kw)

        def run_scanned(x, *args):
            return stack(x, *args)[0]
        return run_scanned
    blocks = [cls(name=f"{name}_{i}", **block_kw) for i in range(num_layers)]

    def run(x, *args):
        for b in blocks:
            x = b(x, *args)
        return x
    return run


def residual_std(num_layers: int, std: float = 0.02) -> float:
    """GPT-2: residual projections scaled by 1/sqrt(2L) so the residual stream's variance stays O(1)."""
    return std / math.sqrt(2 * num_layers)
