"""Decoder-only GPT: its config, presets and the causal language model.

GPT-2 by default: learned positions, pre-LN blocks, tanh-GELU MLP, dropout on embeddings and residual
branches, causal attention, final LayerNorm, output tied to the token embedding. The decoders trained
today (Llama, Mistral, Qwen2, SmolLM) are the same causal stack with other parts, chosen by config
switches: rotary positions (with Llama 3's frequency scaling), RMSNorm, a SwiGLU MLP, grouped-query
attention (`num_kv_heads`), a head width apart from d_model / num_heads (`d_kv`: Qwen3, Mistral-Nemo,
Gemma), RMSNorm on each query and key head (`qk_norm`: Qwen3), biases per projection, an untied output
head and a sliding window.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import flax.linen as nn
import jax.numpy as jnp

from zoo.models.base import ModelConfig, check, check_choice, check_positive
from zoo.nn import layers
from zoo.nn.block import Block
from zoo.nn.positions import Rope
from zoo.nn.stack import residual_std, stack_blocks

POSITIONS = ("learned", "rope")
NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu")
ROPE_SCALINGS = ("none", "llama3")


@dataclass(frozen=True, kw_only=True)
class GptConfig(ModelConfig):
    """A decoder-only transformer: GPT-2 by default; Llama, Mistral, Qwen2 and Qwen3 through the switches below."""

    family: ClassVar[str] = "gpt"
    vocab_size: int = 50257  # rows of the token embedding; >= the tokenizer's vocabulary
    max_len: int = 1024  # the longest sequence the model accepts (learned positions: their table's rows)
    num_layers: int = 12  # transformer blocks (L)
    d_model: int = 768  # residual width (D)
    num_heads: int = 12  # attention heads (N); D must divide by N unless d_kv is set
    d_kv: int = 0  # head width (H); 0: d_model // num_heads (Qwen3, Mistral-Nemo: N * H != D; HF's head_dim)
    d_ff: int = 3072  # MLP hidden width (F)
    dropout: float = 0.1  # on embeddings and on each residual branch, training only
    ln_eps: float = 1e-5  # norm epsilon (GPT-2 LayerNorm 1e-5; Llama RMSNorm 1e-5 or 1e-6)
    # Modern decoders. GPT-2: learned, layernorm, gelu, num_kv_heads 0, biases on, tied, no window.
    positions: str = "learned"  # learned (a table of max_len rows) | rope (rotary, no parameters)
    rope_theta: float = 10000.0  # rope: the base of the frequencies
    rope_scaling: str = "none"  # rope: none | llama3 (Llama 3.1/3.2's long-context frequency scaling)
    rope_factor: float = 8.0  # llama3 scaling: factor
    rope_low_freq_factor: float = 1.0  # llama3 scaling: low-frequency factor
    rope_high_freq_factor: float = 4.0  # llama3 scaling: high-frequency factor
    rope_original_max_len: int = 8192  # llama3 scaling: the context length the frequencies were trained for
    norm: str = "layernorm"  # layernorm | rmsnorm
    mlp: str = "gelu"  # gelu (GPT-2's tanh GELU, 2 matrices) | swiglu (silu-gated, 3 matrices, Llama)
    num_kv_heads: int = 0  # key/value heads K for grouped-query (1: multi-query) attention; 0: num_heads
    qkv_bias: bool = True  # biases on the query/key/value projections (GPT-2, Qwen2: yes; Llama: no)
    out_bias: bool = True  # bias on the attention output projection
    mlp_bias: bool = True  # biases in the MLP
    tie_embeddings: bool = True  # the output projection is the token embedding; else its own `lm_head`
    sliding_window: int = 0  # > 0: each token attends to at most this many latest positions (Mistral)
    qk_norm: bool = False  # RMSNorm (weight [H], eps ln_eps) on each query and key head before rope (Qwen3)

    def __post_init__(self):
        super().__post_init__()
        check_positive(self, "vocab_size", "max_len", "num_layers", "d_model", "num_heads", "d_ff")
        check(self.d_kv >= 0, f"model.d_kv={self.d_kv} must be >= 0 (0: d_model // num_heads)")
        check(self.d_kv > 0 or self.d_model % self.num_heads == 0,
              f"model.d_model={self.d_model} is not divisible by model.num_heads={self.num_heads} (or set model.d_kv)")
        check_choice("positions", self.positions, POSITIONS)
        check_choice("norm", self.norm, NORMS)
        check_choice("mlp", self.mlp, MLPS)
        check_choice("rope_scaling", self.rope_scaling, ROPE_SCALINGS)
        check(self.num_kv_heads >= 0 and (self.num_kv_heads == 0 or self.num_heads % self.num_kv_heads == 0),
              f"model.num_kv_heads={self.num_kv_heads} must divide model.num_heads={self.num_heads} (0: as many)")
        check(self.positions != "rope" or self.head_dim % 2 == 0,
              f"model.positions=rope needs an even head dimension; got {self.head_dim} (model.d_kv, else "
              f"d_model/num_heads)")
        check(self.rope_theta > 0, f"model.rope_theta={self.rope_theta} must be positive")
        check(self.sliding_window >= 0, f"model.sliding_window={self.sliding_window} must be >= 0 (0: off)")

    @property
    def head_dim(self) -> int:
        return self.d_kv or self.d_model // self.num_heads

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    def rope(self) -> Rope | None:
        if self.positions != "rope":
            return None
        return Rope(self.head_dim, self.rope_theta, self.rope_scaling, self.rope_factor, self.rope_low_freq_factor,
                    self.rope_high_freq_factor, self.rope_original_max_len)


GPT_TINY = GptConfig(vocab_size=384, max_len=256, num_layers=4, d_model=128, num_heads=4, d_ff=512, dropout=0.0)
GPT2_SMALL = GptConfig()  # 124,439,808 params, as GPT-2 124M
GPT2_MEDIUM = dataclasses.replace(GPT2_SMALL, num_layers=24, d_model=1024, num_heads=16, d_ff=4096)
GPT2_LARGE = dataclasses.replace(GPT2_SMALL, num_layers=36, d_model=1280, num_heads=20, d_ff=5120)
GPT2_XL = dataclasses.replace(GPT2_SMALL, num_layers=48, d_model=1600, num_heads=25, d_ff=6400)
# Llama-style decoders: rotary positions, RMSNorm, SwiGLU, grouped-query attention, no biases.
_LLAMA = dict(positions="rope", norm="rmsnorm", mlp="swiglu", qkv_bias=False, out_bias=False, mlp_bias=False,
              dropout=0.0)
# A CPU model for the built-in corpus, byte tokens (configs/llama_tiny.py).
LLAMA_TINY = GptConfig(vocab_size=384, max_len=256, num_layers=4, d_model=128, num_heads=4, num_kv_heads=2,
                       d_ff=352, tie_embeddings=False, **_LLAMA)
# SmolLM2-135M: 134,515,008 params.
SMOLLM2_135M = GptConfig(vocab_size=49152, max_len=8192, num_layers=30, d_model=576, num_heads=9, num_kv_heads=3,
                         d_ff=1536, rope_theta=100000.0, **_LLAMA)
# Llama 3.2 1B: 1,235,814,400 params; rope scaled as Llama 3.1/3.2 (factor 32).
LLAMA3_1B = GptConfig(vocab_size=128256, max_len=131072, num_layers=16, d_model=2048, num_heads=32, num_kv_heads=8,
                      d_ff=8192, rope_theta=500000.0, rope_scaling="llama3", rope_factor=32.0, **_LLAMA)
# Qwen2-0.5B: 494,032,768 params; biases on q/k/v only, RMSNorm eps 1e-6.
QWEN2_0_5B = GptConfig(vocab_size=151936, max_len=32768, num_layers=24, d_model=896, num_heads=14, num_kv_heads=2,
                       d_ff=4864, rope_theta=1000000.0, ln_eps=1e-6, **{**_LLAMA, "qkv_bias": True})
# Mistral 7B v0.1: 7,241,732,096 params; untied output, a 4096-token sliding window.
MISTRAL_7B = GptConfig(vocab_size=32000, max_len=32768, num_layers=32, d_model=4096, num_heads=32, num_kv_heads=8,
                       d_ff=14336, sliding_window=4096, tie_embeddings=False, **_LLAMA)
# Qwen3-0.6B: 596,049,920 params; 16 heads of width 128 over d_model 1024, RMSNorm on each q/k head, tied.
QWEN3_0_6B = GptConfig(vocab_size=151936, max_len=40960, num_layers=28, d_model=1024, num_heads=16, num_kv_heads=8,
                       d_kv=128, d_ff=3072, rope_theta=1000000.0, ln_eps=1e-6, qk_norm=True, **_LLAMA)
PRESETS = {"gpt_tiny": GPT_TINY, "gpt2_small": GPT2_SMALL, "gpt2_medium": GPT2_MEDIUM,
           "gpt2_large": GPT2_LARGE, "gpt2_xl": GPT2_XL, "llama_tiny": LLAMA_TINY, "smollm2_135m": SMOLLM2_135M,
           "llama3_1b": LLAMA3_1B, "qwen2_0_5b": QWEN2_0_5B, "qwen3_0_6b": QWEN3_0_6B,
           "mistral_7b": MISTRAL_7B}


class Gpt(nn.Module):
    """ids_BT -> logits_BTV (float32). `decode=True` runs incrementally against the "cache" collection;
    `hidden=True` returns the final hidden states x_BTD instead, for a fused loss (zoo.nn.losses) that
    applies the output projection (`output_embedding(params)`) itself. Packed rows (several examples per
    row) pass `segment_ids_BT` (1, 2, ... per example, 0 on padding), so attention stays within each
    example, and `positions_BT`, which restart at 0 at each example (learned and rotary positions alike).
    Decoding a left-padded batch passes `positions_BT` alone: each row's first real token at position 0, the
    padding before it at negative positions; each token is cached at the slot of its position, padding
    nowhere, so no query sees it (zoo.infer.sample.generate_batch)."""

    cfg: GptConfig

    @nn.compact
    def __call__(self, ids_BT, *, deterministic: bool = True, decode: bool = False, hidden: bool = False,
                 positions_BT=None, segment_ids_BT=None):
        cfg = self.cfg
        dtype, param_dtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        T = ids_BT.shape[1]
        wte = layers.Embed(cfg.vocab_size, cfg.d_model, dtype=dtype, param_dtype=param_dtype, name="wte")
        positions_T = jnp.arange(T)
        if decode:  # absolute position of this chunk = tokens already in the cache
            index = self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
            if self.is_initializing():
                positions_T = jnp.arange(T)
            else:
                positions_T = index.value + jnp.arange(T)
                index.value = index.value + T
        positions = positions_T if positions_BT is None else positions_BT  # [T], or [B, T] for packed rows
        x_BTD = wte(ids_BT)
        if cfg.positions == "learned":
            wpe_PD = self.param("wpe", layers.normal(0.01, (None, "embed")), (cfg.max_len, cfg.d_model), param_dtype)
            # max 0: left padding's negative positions (decoding a batch) take row 0; nothing attends them
            pos_xD = jnp.take(wpe_PD, jnp.maximum(positions, 0), axis=0).astype(dtype)
            x_BTD = x_BTD + (pos_xD if positions.ndim == 2 else pos_xD[None])
        x_BTD = nn.Dropout(cfg.dropout)(x_BTD, deterministic=deterministic)
        x_BTD = layers.constrain(x_BTD, ("batch", "length", "embed"))
        blocks = stack_blocks(
            Block, cfg.num_layers, scan=cfg.scan_layers, remat=cfg.remat, remat_policy=cfg.remat_policy, name="h",
            num_heads=cfg.num_heads, head_dim=cfg.head_dim, d_ff=cfg.d_ff, dropout=cfg.dropout, ln_eps=cfg.ln_eps,
            pre_ln=True, norm_names=("ln_1", "ln_2"), activation=layers.gelu_tanh if cfg.mlp == "gelu" else nn.silu,
            out_std=residual_std(cfg.num_layers), dtype=dtype, param_dtype=param_dtype,
            implementation=cfg.attention_impl, norm=cfg.norm, gated=cfg.mlp == "swiglu",
            num_kv_heads=cfg.kv_heads, qkv_bias=cfg.qkv_bias, out_bias=cfg.out_bias, mlp_bias=cfg.mlp_bias,
            rope=cfg.rope(), sliding_window=cfg.sliding_window, qk_norm=cfg.qk_norm)
        # mask None + is_causal: the attention backend builds the causal mask (cheapest on cuDNN).
        x_BTD = blocks(x_BTD, None, deterministic, decode, positions, segment_ids_BT)
        norm = layers.rms_norm if cfg.norm == "rmsnorm" else layers.layer_norm
        x_BTD = norm(cfg.ln_eps, dtype, param_dtype, name="ln_f")(x_BTD)
        if hidden:
            return x_BTD
        if cfg.tie_embeddings:
            return wte.attend(x_BTD)
        return layers.Embed(cfg.vocab_size, cfg.d_model, dtype=dtype, param_dtype=param_dtype,
                            name="lm_head").attend(x_BTD)


def output_embedding(cfg: GptConfig, params):
    """w_VD of the output projection: the token embedding when tied, else `lm_head`."""
    return params["wte" if cfg.tie_embeddings else "lm_head"]["embedding"]
