"""The transformer block GPT and BERT share: self-attention then MLP, each a residual sublayer with its
norm before (pre-LN, GPT-2) or after (post-LN, BERT) it. The encoder-decoder's blocks add
cross-attention and relative position bias and build on the same `layers.sublayer`.

Parameter names are the families' own checkpoint keys: the two norms are named by `norm_names`
(GPT-2: ln_1, ln_2; BERT: attn_ln, mlp_ln), the sublayers `attn` and `mlp`.
"""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax.numpy as jnp

from zoo.nn.attention import Attention
from zoo.nn.layers import Dtype, Mlp, constrain, gelu_tanh, layer_norm, sublayer


class Block(nn.Module):
    """x -> sublayer(Attn) -> sublayer(Mlp). Causal when called with mask None (the backend builds the
    causal mask); `decode` runs self-attention against the KV cache. Returns (x, None) when scanned."""

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

    @nn.compact
    def __call__(self, x_BTD, mask_B1TS, deterministic: bool, decode: bool = False, positions_T=None):
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        D = x_BTD.shape[-1]
        attn_norm, mlp_norm = (layer_norm(self.ln_eps, name=n, **kw) for n in self.norm_names)
        attn = Attention(self.num_heads, D // self.num_heads, out_std=self.out_std,
                         implementation=self.implementation, name="attn", **kw)
        mlp = Mlp(self.d_ff, self.activation, out_std=self.out_std, name="mlp", **kw)
        res = dict(pre_ln=self.pre_ln, dropout=self.dropout, deterministic=deterministic)
        x_BTD = sublayer(x_BTD, lambda h: attn(h, mask_B1TS, is_causal=mask_B1TS is None, decode=decode,
                                               positions_T=positions_T), attn_norm, **res)
        x_BTD = sublayer(x_BTD, mlp, mlp_norm, **res)
        x_BTD = constrain(x_BTD, ("batch", "length", "embed"))
        return (x_BTD, None) if self.scanned else x_BTD
