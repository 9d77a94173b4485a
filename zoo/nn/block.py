"""The transformer block GPT and BERT share: self-attention then MLP, each a residual sublayer with its
norm before (pre-LN, GPT-2, Llama) or after (post-LN, BERT) it; the modern decoders' parts (RMSNorm,
SwiGLU, grouped-query attention, rotary positions, a sliding window, a head width apart from D / N, RMSNorm
on each query and key head; Gemma's (1 + w) RMSNorm, norms after each sublayer too, attention soft-capping
and local layers beside global ones) are switches of the same block. The encoder-decoder's blocks add
cross-attention and relative position bias and build on the same `layers.sublayer`.

Parameter names are the families' own checkpoint keys: the two norms are named by `norm_names`
(GPT-2: ln_1, ln_2; BERT: attn_ln, mlp_ln), the sublayers `attn` and `mlp`.
"""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax.numpy as jnp

from zoo.nn.attention import Attention
from zoo.nn.layers import Dtype, GatedMlp, Mlp, constrain, gelu_tanh, make_norm, sublayer
from zoo.nn.moe import MoeMlp
from zoo.nn.positions import Rope


class Block(nn.Module):
    """x -> sublayer(Attn) -> sublayer(Mlp). Causal when called with mask None (the backend builds the
    causal mask); `decode` runs self-attention against the KV cache; `segment_ids_BT` (packed examples) keeps
    attention within each example and `positions_T` may then be per row ([B, T]); `value_embed_BTKH` is mixed
    into the attention's values (zoo.nn.attention.Attention). Returns (x, None) when scanned."""

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
    # Mixture of experts (Mixtral, Qwen3-MoE; zoo.nn.moe): num_experts > 0 makes the MLP that many gated
    # experts of width d_ff, each token routed to experts_per_token of them.
    num_experts: int = 0
    experts_per_token: int = 2
    moe_norm_topk: bool = True
    parallel_residual: bool = False  # pre-LN only: x + attn(norm_1(x)) + mlp(norm_2(x)) (GPT-NeoX, GPT-J)
    # Gemma (1, 2, 3): norm rmsnorm_plus1 ((1 + w) RMSNorm, on the q/k heads too), a norm after each sublayer
    # as well, an attention scale and logit cap of its own, and local (windowed) layers beside global ones.
    post_norms: bool = False  # each sublayer's output normed (post_<norm_names>) before the residual add
    attn_scale: float | None = None  # attention logits scale; None: 1/sqrt(H)
    attn_softcap: float = 0.0  # > 0: attention logits cap * tanh(logits / cap); 0: off
    rope_local: Rope | None = None  # rotary positions of local layers; None: `rope`
    local: bool | None = None  # None: sliding_window (if any) on every layer; else whether this layer is local

    @nn.compact
    def __call__(self, x_BTD, mask_B1TS, deterministic: bool, decode: bool = False, positions_T=None,
                 segment_ids_BT=None, per_layer=None, value_embed_BTKH=None):
        # per_layer: a scanned stack's values of the attributes that differ by layer (zoo.nn.stack)
        local = self.local if per_layer is None else per_layer["local"]
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        D = x_BTD.shape[-1]
        norm_cls = make_norm(self.norm)
        attn_norm, mlp_norm = (norm_cls(self.ln_eps, name=n, **kw) for n in self.norm_names)
        attn = Attention(self.num_heads, self.head_dim or D // self.num_heads, num_kv_heads=self.num_kv_heads,
                         out_std=self.out_std, use_bias=self.qkv_bias, out_bias=self.out_bias, rope=self.rope,
                         sliding_window=self.sliding_window, qk_norm_eps=self.ln_eps if self.qk_norm else None,
                         implementation=self.implementation, scale=self.attn_scale, softcap=self.attn_softcap,
                         qk_norm_plus1=self.norm == "rmsnorm_plus1", rope_local=self.rope_local, name="attn", **kw)
        mlp_cls = GatedMlp if self.gated else Mlp
        if self.num_experts:
            mlp = MoeMlp(self.num_experts, self.experts_per_token, self.d_ff, self.activation,
                         norm_topk=self.moe_norm_topk, out_std=self.out_std, name="mlp", **kw)
        else:
            mlp = mlp_cls(self.d_ff, self.activation, out_std=self.out_std, use_bias=self.mlp_bias, name="mlp",
                          **kw)
        res = dict(pre_ln=self.pre_ln, dropout=self.dropout, deterministic=deterministic)
        attend = lambda h: attn(h, mask_B1TS, is_causal=mask_B1TS is None, decode=decode,  # noqa: E731
                                positions_T=positions_T, segment_ids_BT=segment_ids_BT, local=local,
                                value_embed_BTKH=value_embed_BTKH)
        if self.post_norms:  # Gemma 2/3's sandwich: x + post_norm(f(norm(x)))
            post_attn, post_mlp = (norm_cls(self.ln_eps, name=f"post_{n}", **kw) for n in self.norm_names)
            attend = lambda h, f=attend: post_attn(f(h))  # noqa: E731
            mlp = lambda h, f=mlp: post_mlp(f(h))  # noqa: E731
        if self.parallel_residual:  # both branches read the block's input; each its own norm and dropout
            drop = nn.Dropout(self.dropout)
            x_BTD = x_BTD + drop(attend(attn_norm(x_BTD)), deterministic=deterministic) + \
                drop(mlp(mlp_norm(x_BTD)), deterministic=deterministic)
        else:
            x_BTD = sublayer(x_BTD, attend, attn_norm, **res)
            x_BTD = sublayer(x_BTD, mlp, mlp_norm, **res)
        x_BTD = constrain(x_BTD, ("batch", "length", "embed"))
        return (x_BTD, None) if self.scanned else x_BTD
