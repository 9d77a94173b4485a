"""Decoder-only GPT (GPT-2 architecture): its config, presets and the causal language model.

Learned positions, pre-LN blocks, tanh-GELU MLP, dropout on embeddings and residual branches,
causal attention, final LayerNorm, output tied to the token embedding.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import flax.linen as nn
import jax.numpy as jnp

from zoo.models.base import ModelConfig, check, check_positive
from zoo.nn import layers
from zoo.nn.block import Block
from zoo.nn.stack import residual_std, stack_blocks


@dataclass(frozen=True, kw_only=True)
class GptConfig(ModelConfig):
    """GPT-2 architecture: learned positions, pre-LN blocks, GELU MLP, output tied to the embedding."""

    family: ClassVar[str] = "gpt"
    vocab_size: int = 50257  # rows of the token embedding; >= the tokenizer's vocabulary
    max_len: int = 1024  # learned positions; the longest sequence the model accepts
    num_layers: int = 12  # transformer blocks (L)
    d_model: int = 768  # residual width (D)
    num_heads: int = 12  # attention heads (N); D must divide by N
    d_ff: int = 3072  # MLP hidden width (F)
    dropout: float = 0.1  # on embeddings and on each residual branch, training only
    ln_eps: float = 1e-5  # LayerNorm epsilon (GPT-2 uses 1e-5)

    def __post_init__(self):
        super().__post_init__()
        check_positive(self, "vocab_size", "max_len", "num_layers", "d_model", "num_heads", "d_ff")
        check(self.d_model % self.num_heads == 0,
              f"model.d_model={self.d_model} is not divisible by model.num_heads={self.num_heads}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

GPT_TINY = GptConfig(vocab_size=384, max_len=256, num_layers=4, d_model=128, num_heads=4, d_ff=512, dropout=0.0)
GPT2_SMALL = GptConfig()  # 124,439,808 params, as GPT-2 124M
GPT2_MEDIUM = dataclasses.replace(GPT2_SMALL, num_layers=24, d_model=1024, num_heads=16, d_ff=4096)
GPT2_LARGE = dataclasses.replace(GPT2_SMALL, num_layers=36, d_model=1280, num_heads=20, d_ff=5120)
GPT2_XL = dataclasses.replace(GPT2_SMALL, num_layers=48, d_model=1600, num_heads=25, d_ff=6400)
PRESETS = {"gpt_tiny": GPT_TINY, "gpt2_small": GPT2_SMALL, "gpt2_medium": GPT2_MEDIUM,
           "gpt2_large": GPT2_LARGE, "gpt2_xl": GPT2_XL}


class Gpt(nn.Module):
    """ids_BT -> logits_BTV (float32). `decode=True` runs incrementally against the "cache" collection;
    `hidden=True` returns the final hidden states x_BTD instead, for a fused loss (zoo.nn.losses) that
    applies the tied output projection params["wte"]["embedding"] itself."""

    cfg: GptConfig

    @nn.compact
    def __call__(self, ids_BT, *, deterministic: bool = True, decode: bool = False, hidden: bool = False):
        cfg = self.cfg
        dtype, param_dtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        T = ids_BT.shape[1]
        wte = layers.Embed(cfg.vocab_size, cfg.d_model, dtype=dtype, param_dtype=param_dtype, name="wte")
        wpe_PD = self.param("wpe", layers.normal(0.01, (None, "embed")), (cfg.max_len, cfg.d_model), param_dtype)
        positions_T = jnp.arange(T)
        if decode:  # absolute position of this chunk = tokens already in the cache
            index = self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
            if self.is_initializing():
                positions_T = jnp.arange(T)
            else:
                positions_T = index.value + jnp.arange(T)
                index.value = index.value + T
        x_BTD = wte(ids_BT) + jnp.take(wpe_PD, positions_T, axis=0).astype(dtype)[None]
        x_BTD = nn.Dropout(cfg.dropout)(x_BTD, deterministic=deterministic)
        x_BTD = layers.constrain(x_BTD, ("batch", "length", "embed"))
        blocks = stack_blocks(
            Block, cfg.num_layers, scan=cfg.scan_layers, remat=cfg.remat, remat_policy=cfg.remat_policy, name="h",
            num_heads=cfg.num_heads, d_ff=cfg.d_ff, dropout=cfg.dropout, ln_eps=cfg.ln_eps, pre_ln=True,
            norm_names=("ln_1", "ln_2"), activation=layers.gelu_tanh, out_std=residual_std(cfg.num_layers),
            dtype=dtype, param_dtype=param_dtype, implementation=cfg.attention_impl)
        # mask None + is_causal: the attention backend builds the causal mask (cheapest on cuDNN).
        x_BTD = blocks(x_BTD, None, deterministic, decode, positions_T)
        x_BTD = layers.layer_norm(cfg.ln_eps, dtype, param_dtype, name="ln_f")(x_BTD)
        return x_BTD if hidden else wte.attend(x_BTD)
