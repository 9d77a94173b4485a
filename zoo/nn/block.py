"""The transformer block GPT and BERT share: self-attention then MLP, each a residual sublayer with its
norm before (pre-LN, GPT-2, Llama) or after (post-LN, BERT) it; the modern decoders' parts (RMSNorm,
SwiGLU, grouped-query attention, rotary positions, a sliding window, a head width apart from D / N, RMSNorm
on each query and key head) are switches of the same block. The encoder-decoder's blocks add
cross-attention and relative position bias and build on the same `layers.sublayer`.

Parameter names are the families' own checkpoint keys: the two norms are named by `norm_names`
(GPT-2: ln_1, ln_2; BERT: attn_ln, mlp_ln), the sublayers `attn` and `mlp`.
"""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax.numpy as jnp

from zoo.nn.attention import Attention
from zoo.nn.layers import Dtype, GatedMlp, Mlp, constrain, gelu_tanh, layer_norm, rms_norm, sublayer
from zoo.nn.positions import Rope


class Block(nn.Module):
    """x -> sublayer(Attn) -> sublayer(Mlp). Causal when called with mask None (the backend builds the
    causal mask); `decode` runs self-attention against the KV cache; `segment_ids_BT` (packed examples) keeps
    attention within each example and `positions_T` may then be per row ([B, T]). Returns (x, None) when
    scanned."""

    num_heads: int
    d_ff: int
    dropout: float
    ln_eps: float
    out_std: float  # init std of the two residual projections
    pre_ln: bool = True
    norm_names: tuple = ("ln_1", "ln_2")  # (before/after attention, before/after the MLP)
    activation: Callable = gelu_tanh
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    implementation: str | None = None
    scanned: bool = False
    # Modern decoders (Llama, Mistral, Qwen2): RMSNorm, a SwiGLU MLP, grouped-query attention, rotary
    # positions, a sliding window and biases per projection. The defaults are GPT-2's and BERT's.
    norm: str = "layernorm"  # layernorm | rmsnorm
    gated: bool = False  # the MLP is gated (act(x W_gate) * x W_fc): SwiGLU with activation silu
    num_kv_heads: int | None = None
    qkv_bias: bool = True
    out_bias: bool = True
    mlp_bias: bool = True
    rope: Rope | None = None
    sliding_window: int = 0
    head_dim: int | None = None  # H; None: D // num_heads
    qk_norm: bool = False  # RMSNorm (eps ln_eps) on each query and key head before rope (Qwen3)

    @nn.compact
    def __call__(self, x_BTD, mask_B1TS, deterministic: bool, decode: bool = False, positions_T=None,
                 segment_ids_BT=None):
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        D = x_BTD.shape[-1]
        make_norm = rms_norm if self.norm == "rmsnorm" else layer_norm
        attn_norm, mlp_norm = (make_norm(self.ln_eps, name=n, **kw) for n in self.norm_names)
        attn = Attention(self.num_heads, self.head_dim or D // self.num_heads, num_kv_heads=self.num_kv_heads,
                         out_std=self.out_std, use_bias=self.qkv_bias, out_bias=self.out_bias, rope=self.rope,
                         sliding_window=self.sliding_window, qk_norm_eps=self.ln_eps if self.qk_norm else None,
                         implementation=self.implementation, name="attn", **kw)
        mlp_cls = GatedMlp if self.gated else Mlp
        mlp = mlp_cls(self.d_ff, self.activation, out_std=self.out_std, use_bias=self.mlp_bias, name="mlp", **kw)
        res = dict(pre_ln=self.pre_ln, dropout=self.dropout, deterministic=deterministic)
        x_BTD = sublayer(x_BTD, lambda h: attn(h, mask_B1TS, is_causal=mask_B1TS is None, decode=decode,
                                               positions_T=positions_T, segment_ids_BT=segment_ids_BT),
                         attn_norm, **res)
        x_BTD = sublayer(x_BTD, mlp, mlp_norm, **res)
        x_BTD = constrain(x_BTD, ("batch", "length", "embed"))
        return (x_BTD, None) if self.scanned else x_BTD
