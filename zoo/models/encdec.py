"""Encoder-decoder transformer: its config, presets (Vaswani base, T5-small, BART-base, tiny) and the model.

One module covers the three lineages; `EncDecConfig` switches what differs: positions (sinusoidal,
learned, T5 relative buckets), norm placement (pre/post) and kind (LayerNorm/RMSNorm), activation
(ReLU, GELU, gated GELU), biases, scalings, tying and a logits bias (BART). `EncDec.encode()` runs
the encoder once per input; `EncDec.decode()` runs the decoder over target tokens, either whole
(training, teacher forcing) or incrementally with `decode=True` against the "cache" collection:
self-attention keys and values grow one position per call, cross-attention keys and values of the
encoder output are projected once, by the call that creates the cache (see zoo.infer.decoding).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

import flax.linen as nn
import jax.numpy as jnp

from zoo.models.base import ModelConfig, check, check_choice, check_positive
from zoo.nn import layers
from zoo.nn.positions import RelativePositionBias, sinusoidal_positions
from zoo.nn.attention import Attention
from zoo.nn.stack import residual_std, stack_blocks

POSITIONS = ("sinusoidal", "learned", "relative")
NORMS = ("layernorm", "rmsnorm")
# model.activation -> the MLP's nonlinearity: exact GELU for "gelu" (BART), tanh GELU as T5 v1.1's gate.
ACTIVATIONS = {"relu": layers.ACTIVATIONS["relu"], "gelu": layers.ACTIVATIONS["gelu"],
               "gated_gelu": layers.ACTIVATIONS["gelu_tanh"]}


@dataclass(frozen=True, kw_only=True)
class EncDecConfig(ModelConfig):
    """Encoder-decoder transformer (Vaswani, T5, BART are presets): the variants are switches here."""

    family: ClassVar[str] = "encdec"
    vocab_size: int = 37000  # rows of the token embedding; >= the tokenizer's vocabulary + 2 (zoo's BOS, PAD)
    max_len: int = 256  # longest source and longest target (rows of learned position tables)
    num_encoder_layers: int = 6  # encoder blocks
    num_decoder_layers: int = 6  # decoder blocks (self-attention, cross-attention, MLP)
    d_model: int = 512  # residual width (D)
    num_heads: int = 8  # attention heads (N)
    d_kv: int = 0  # head width (H); 0: d_model // num_heads (T5 may set it apart)
    d_ff: int = 2048  # MLP hidden width (F)
    dropout: float = 0.1  # on embeddings and each residual branch, training only
    positions: str = "sinusoidal"  # sinusoidal (Vaswani) | learned (BART) | relative (T5 buckets)
    position_offset: int = 0  # learned: extra table rows before position 0 (BART keeps 2)
    relative_buckets: int = 32  # relative: offset buckets per stack
    relative_max_distance: int = 128  # relative: offsets beyond this share the last bucket
    norm: str = "layernorm"  # layernorm | rmsnorm (T5: scale only, no mean, no bias)
    pre_ln: bool = False  # norm before each sublayer + a final norm per stack (T5); else after (Vaswani, BART)
    embed_norm: bool = False  # a norm on each stack's embedded input (BART's layernorm_embedding)
    ln_eps: float = 1e-5  # norm epsilon
    activation: str = "relu"  # relu | gelu | gated_gelu (T5 v1.1: gelu(x W_gate) * x W_fc)
    use_bias: bool = True  # biases in attention and MLP projections (T5 has none)
    attention_scale: bool = True  # divide attention logits by sqrt(H) (T5 folds it into its init)
    embed_scale: bool = False  # multiply token embeddings by sqrt(D) (Vaswani)
    share_embeddings: bool = True  # source and target tokens use one embedding table
    tie_output: bool = True  # output projection = the target embedding, transposed
    output_scale: bool = False  # decoder output times D^-0.5 before the output projection (T5 v1.0)
    logits_bias: bool = False  # a learned bias [V] added to the logits (BART's final_logits_bias)

    def __post_init__(self):
        super().__post_init__()
        check_positive(self, "vocab_size", "max_len", "num_encoder_layers", "num_decoder_layers", "d_model",
                       "num_heads", "d_ff", "relative_buckets", "relative_max_distance")
        check(self.d_kv >= 0 and self.position_offset >= 0, "model.d_kv and model.position_offset must be >= 0")
        check(self.d_kv > 0 or self.d_model % self.num_heads == 0,
              f"model.d_model={self.d_model} is not divisible by model.num_heads={self.num_heads} (or set model.d_kv)")
        for name, choices in (("positions", POSITIONS), ("norm", NORMS), ("activation", ACTIVATIONS)):
            check_choice(name, getattr(self, name), choices)
        check(self.positions != "sinusoidal" or self.d_model % 2 == 0,
              f"model.positions='sinusoidal' needs an even model.d_model, got {self.d_model}")
        check(self.relative_buckets >= 4, f"model.relative_buckets={self.relative_buckets} must be >= 4")

    @property
    def head_dim(self) -> int:
        return self.d_kv or self.d_model // self.num_heads

    @property
    def num_layers(self) -> int:
        return self.num_encoder_layers + self.num_decoder_layers

ENCDEC_TINY = EncDecConfig(vocab_size=264, max_len=128, num_encoder_layers=3, num_decoder_layers=3, d_model=128,
                           num_heads=4, d_ff=512, dropout=0.0, positions="sinusoidal", pre_ln=True,
                           activation="gelu", embed_scale=True)
# Vaswani et al. (2017) base, shared 37k BPE vocabulary: 63,082,496 params (the paper rounds to 65M).
TRANSFORMER_BASE = EncDecConfig(vocab_size=37000, ln_eps=1e-6, embed_scale=True)  # trained with train.label_smoothing=0.1
# t5-small: 60,506,624 params as Hugging Face counts it (the tied output projection once).
T5_SMALL = EncDecConfig(vocab_size=32128, max_len=512, d_model=512, num_heads=8, d_kv=64, d_ff=2048, dropout=0.1,
                        positions="relative", norm="rmsnorm", pre_ln=True, ln_eps=1e-6, activation="relu",
                        use_bias=False, attention_scale=False, output_scale=True)
# bart-base: 139,420,416 params as Hugging Face counts it (final_logits_bias is a buffer there, absent here).
BART_BASE = EncDecConfig(vocab_size=50265, max_len=1024, d_model=768, num_heads=12, d_ff=3072, dropout=0.1,
                         positions="learned", position_offset=2, embed_norm=True, activation="gelu")
PRESETS = {"encdec_tiny": ENCDEC_TINY, "transformer_base": TRANSFORMER_BASE, "t5_small": T5_SMALL,
           "bart_base": BART_BASE}


def _dtypes(cfg: EncDecConfig) -> dict:
    return dict(dtype=jnp.dtype(cfg.dtype), param_dtype=jnp.dtype(cfg.param_dtype))


def embed_std(cfg: EncDecConfig) -> float:
    """Embedding init: D^-0.5 when scaled by sqrt(D) (unit-variance inputs, Vaswani / fairseq); 1.0 for
    T5, whose output projection scales by D^-0.5 instead; else 0.02 (BART, GPT)."""
    if cfg.embed_scale:
        return cfg.d_model ** -0.5
    return 1.0 if cfg.output_scale else 0.02


def _norm(cfg: EncDecConfig, name: str):
    make = layers.rms_norm if cfg.norm == "rmsnorm" else layers.layer_norm
    return make(cfg.ln_eps, name=name, **_dtypes(cfg))


def _attention(cfg: EncDecConfig, out_std: float, name: str) -> Attention:
    return Attention(cfg.num_heads, cfg.head_dim, out_std=out_std, use_bias=cfg.use_bias,
                            scale=None if cfg.attention_scale else 1.0,
                            implementation=cfg.attention_impl,
                            name=name, **_dtypes(cfg))


def _mlp(cfg: EncDecConfig, out_std: float):
    if cfg.activation == "gated_gelu":
        return layers.GatedMlp(cfg.d_ff, ACTIVATIONS["gated_gelu"], out_std=out_std, name="mlp", **_dtypes(cfg))
    return layers.Mlp(cfg.d_ff, ACTIVATIONS[cfg.activation], out_std=out_std, use_bias=cfg.use_bias, name="mlp",
                      **_dtypes(cfg))


def _residual(cfg: EncDecConfig, x_BTD, f, norm_name: str, deterministic: bool):
    """Pre-LN: x + f(norm(x)); post-LN: norm(x + f(x)). Dropout on the branch either way."""
    return layers.sublayer(x_BTD, f, _norm(cfg, norm_name), pre_ln=cfg.pre_ln, dropout=cfg.dropout,
                           deterministic=deterministic)


class EncoderBlock(nn.Module):
    """Bidirectional self-attention over the valid source tokens, then the MLP."""

    cfg: EncDecConfig
    out_std: float  # init std of the residual projections
    scanned: bool = False

    @nn.compact
    def __call__(self, x_BSD, mask_B11S, deterministic: bool, decode: bool, bias_1NSS=None):
        cfg = self.cfg
        attn = _attention(cfg, self.out_std, "attn")
        x_BSD = _residual(cfg, x_BSD, lambda h: attn(h, mask_B11S, bias_BNTS=bias_1NSS), "ln_attn", deterministic)
        x_BSD = _residual(cfg, x_BSD, _mlp(cfg, self.out_std), "ln_mlp", deterministic)
        x_BSD = layers.constrain(x_BSD, ("batch", "length", "embed"))
        return (x_BSD, None) if self.scanned else x_BSD


class DecoderBlock(nn.Module):
    """Causal self-attention (KV-cached when decoding), cross-attention over the encoder output, MLP."""

    cfg: EncDecConfig
    out_std: float
    scanned: bool = False

    @nn.compact
    def __call__(self, y_BTD, mask_B1TS, deterministic: bool, decode: bool, positions_T, bias_1NTS, enc_BSD,
                 cross_mask_B11S):
        cfg = self.cfg
        attn, cross = _attention(cfg, self.out_std, "attn"), _attention(cfg, self.out_std, "cross")
        # mask None + is_causal in training: the backend builds the causal mask; decoding builds it from the cache.
        y_BTD = _residual(cfg, y_BTD, lambda h: attn(h, mask_B1TS, is_causal=mask_B1TS is None, decode=decode,
                                                     positions_T=positions_T, bias_BNTS=bias_1NTS),
                          "ln_attn", deterministic)
        y_BTD = _residual(cfg, y_BTD, lambda h: cross(h, cross_mask_B11S, kv_BSD=enc_BSD, decode=decode),
                          "ln_cross", deterministic)
        y_BTD = _residual(cfg, y_BTD, _mlp(cfg, self.out_std), "ln_mlp", deterministic)
        y_BTD = layers.constrain(y_BTD, ("batch", "length", "embed"))
        return (y_BTD, None) if self.scanned else y_BTD


class Positions(nn.Module):
    """Absolute position signal pos_TD added to embedded tokens: a learned table or sinusoids."""

    cfg: EncDecConfig

    @nn.compact
    def __call__(self, positions_T):
        cfg = self.cfg
        if cfg.positions == "sinusoidal":
            return sinusoidal_positions(positions_T, cfg.d_model)
        table_PD = self.param("embedding", layers.normal(0.02, (None, "embed")),
                              (cfg.max_len + cfg.position_offset, cfg.d_model), jnp.dtype(cfg.param_dtype))
        return jnp.take(table_PD, positions_T + cfg.position_offset, axis=0)


def _stack_input(cfg: EncDecConfig, x_BTD, positions_T, deterministic: bool):
    """Embedded tokens -> the first block's input: absolute positions, optional norm, dropout."""
    if cfg.positions != "relative":
        x_BTD = x_BTD + Positions(cfg, name="position")(positions_T).astype(x_BTD.dtype)[None]
    if cfg.embed_norm:
        x_BTD = _norm(cfg, "ln_embed")(x_BTD)
    x_BTD = nn.Dropout(cfg.dropout)(x_BTD, deterministic=deterministic)
    return layers.constrain(x_BTD, ("batch", "length", "embed"))


def _blocks(cfg: EncDecConfig, block_cls, num_layers: int):
    return stack_blocks(block_cls, num_layers, scan=cfg.scan_layers, remat=cfg.remat, remat_policy=cfg.remat_policy,
                        name="layers", cfg=cfg, out_std=residual_std(num_layers))


def _relative_bias(cfg: EncDecConfig, bidirectional: bool):
    return RelativePositionBias(cfg.num_heads, cfg.relative_buckets, cfg.relative_max_distance,
                                       bidirectional, jnp.dtype(cfg.param_dtype), name="relative_bias")


class Encoder(nn.Module):
    """Embedded source x_BSD (+ valid_BS) -> encoder output enc_BSD."""

    cfg: EncDecConfig

    @nn.compact
    def __call__(self, x_BSD, valid_BS, deterministic: bool = True):
        cfg = self.cfg
        positions_S = jnp.arange(x_BSD.shape[1])
        x_BSD = _stack_input(cfg, x_BSD, positions_S, deterministic)
        bias_1NSS = _relative_bias(cfg, True)(positions_S, positions_S) if cfg.positions == "relative" else None
        # Padding keys are masked for every query; right padding never shifts a real token's position.
        x_BSD = _blocks(cfg, EncoderBlock, cfg.num_encoder_layers)(
            x_BSD, valid_BS[:, None, None, :], deterministic, False, bias_1NSS)
        return _norm(cfg, "ln_final")(x_BSD) if cfg.pre_ln else x_BSD


class Decoder(nn.Module):
    """Embedded target inputs y_BTD, encoder output -> final decoder states (before the output projection)."""

    cfg: EncDecConfig

    @nn.compact
    def __call__(self, y_BTD, enc_BSD, src_valid_BS, deterministic: bool = True, decode: bool = False):
        cfg = self.cfg
        T = y_BTD.shape[1]
        positions_T = key_positions_S = jnp.arange(T)
        if decode:
            # The call that creates the cache (its length = this call's T) runs at positions 0..T-1 and leaves
            # the index at 0; each later call continues at the index.
            creating = not self.has_variable("cache", "index")
            index = self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
            # Positions of the cached keys: its static length is the cache length the relative bias needs.
            key_positions_S = self.variable("cache", "key_positions", lambda: jnp.arange(T)).value
            if not creating:
                positions_T = index.value + jnp.arange(T)
                index.value = index.value + T
        y_BTD = _stack_input(cfg, y_BTD, positions_T, deterministic)
        bias_1NTS = (_relative_bias(cfg, False)(positions_T, key_positions_S) if cfg.positions == "relative"
                     else None)
        y_BTD = _blocks(cfg, DecoderBlock, cfg.num_decoder_layers)(
            y_BTD, None, deterministic, decode, positions_T, bias_1NTS, enc_BSD, src_valid_BS[:, None, None, :])
        return _norm(cfg, "ln_final")(y_BTD) if cfg.pre_ln else y_BTD


class EncDec(nn.Module):
    """(src_BS, src_valid_BS, tgt_in_BT) -> logits_BTV (float32); `encode` and `decode` run the halves."""

    cfg: EncDecConfig

    def setup(self):
        cfg = self.cfg
        embed = lambda: layers.Embed(cfg.vocab_size, cfg.d_model, std=embed_std(cfg), **_dtypes(cfg))
        self.embed = embed()
        self.target_embed = self.embed if cfg.share_embeddings else embed()
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        if not cfg.tie_output:
            self.lm_head = layers.Einsum((cfg.d_model, cfg.vocab_size), ("embed", "vocab"), "BTD,DV->BTV",
                                         std=cfg.d_model ** -0.5, **_dtypes(cfg))
        if cfg.logits_bias:  # zero init: a converted BART checkpoint brings its own
            self.logits_bias = self.param("logits_bias", layers.zeros(("vocab",)), (cfg.vocab_size,),
                                          jnp.dtype(cfg.param_dtype))

    def _embed(self, table, ids_BT):
        x_BTD = table(ids_BT)
        return x_BTD * math.sqrt(self.cfg.d_model) if self.cfg.embed_scale else x_BTD

    def encode(self, src_BS, src_valid_BS, deterministic: bool = True):
        return self.encoder(self._embed(self.embed, src_BS), src_valid_BS, deterministic)

    def decode(self, tgt_in_BT, enc_BSD, src_valid_BS, deterministic: bool = True, decode: bool = False,
               hidden: bool = False):
        """logits_BTV; hidden=True: the decoder output h_BTD instead (scaled as the output projection
        takes it), for a fused loss that applies `output_projection(cfg, params)` itself."""
        h_BTD = self.decoder(self._embed(self.target_embed, tgt_in_BT), enc_BSD, src_valid_BS, deterministic,
                             decode)
        if self.cfg.output_scale:
            h_BTD = h_BTD * self.cfg.d_model ** -0.5
        if hidden:
            return h_BTD
        if self.cfg.tie_output:
            logits_BTV = self.target_embed.attend(h_BTD)
        else:
            logits_BTV = self.lm_head(h_BTD).astype(jnp.float32)
        if self.cfg.logits_bias:
            logits_BTV = logits_BTV + self.logits_bias.astype(jnp.float32)
        return logits_BTV

    def __call__(self, src_BS, src_valid_BS, tgt_in_BT, deterministic: bool = True, hidden: bool = False):
        enc_BSD = self.encode(src_BS, src_valid_BS, deterministic)
        return self.decode(tgt_in_BT, enc_BSD, src_valid_BS, deterministic, hidden=hidden)


def output_projection(cfg: EncDecConfig, params) -> tuple:
    """(w_VD, bias_V or None): the decoder's output projection as stored in `params` (the tied target
    embedding, or the lm_head kernel transposed) and the logits bias."""
    if cfg.tie_output:
        w_VD = params["embed" if cfg.share_embeddings else "target_embed"]["embedding"]
    else:
        w_VD = params["lm_head"]["kernel"].T
    return w_VD, params["logits_bias"] if cfg.logits_bias else None


def with_vocab(cfg: EncDecConfig, n_vocab: int, multiple: int = 128) -> EncDecConfig:
    """cfg with vocab_size = a tokenizer's n_vocab + 2 specials (BOS, PAD), rounded up to `multiple`."""
    return dataclasses.replace(cfg, vocab_size=-(-(n_vocab + 2) // multiple) * multiple)
