"""BERT (Devlin et al. 2019): its config, presets, the encoder, and its masked-LM, classification and token-
classification models.

Word + position + segment embeddings summed and LayerNorm'd; post-LN encoder blocks (`pre_ln=True`
moves each LayerNorm in front of its sublayer and adds a final one); exact (erf) GELU as BERT's
"gelu"; non-causal attention under a padding mask built once at the top. Heads over the same
`bert` submodule, so `init_from` an MLM run copies the whole encoder into a classifier:

  BertMlm:        bert -> mlm_head (dense -> GELU -> LayerNorm -> word embedding^T + bias) -> logits_BTV
  BertClassifier: bert -> cls_head (pooler: dense + tanh on [CLS] -> dropout -> dense, zero-init) -> logits_BC
                  (`classifier`: RoBERTa's adds a dropout before the dense, DistilBERT's is ReLU'd)
  BertTokenClassifier: bert -> token_head (dropout -> dense at every position, zero-init) -> logits_BTC
  BertEncoder:    bert -> (x_BTD, pooled_BD), the pooler under `cls_head/pooler` (Hugging Face's bare
                  BertModel: a converted MiniLM); `init_from` it into a classifier carries the pooler too

Param names are stable and semantic for a Hugging Face converter, e.g. `bert/embed/word/embedding`
= embeddings.word_embeddings, `bert/encoder/layer_3/attn/query/kernel` [D, N, H] = encoder.layer.3
.attention.self.query (transposed, split by head), `attn_ln` = attention.output.LayerNorm, `mlp/fc`
= intermediate.dense, `mlp/proj` = output.dense, `mlp_ln` = output.LayerNorm, `cls_head/pooler` =
pooler.dense, `mlm_head/transform` = cls.predictions.transform.dense, `token_head/out` = classifier (of
BertForTokenClassification).
RoBERTa / XLM-R and DistilBERT are options of the same model: `position_offset` (RoBERTa numbers real
tokens from its pad id + 1), `type_vocab_size` 1 (one token type) or 0 (DistilBERT: none), and
`classifier`, the [CLS] head's form (RoBERTa's classifier.dense / DistilBERT's pre_classifier are
`cls_head/pooler`); zoo.hf.roberta and zoo.hf.distilbert hold their key tables.
Attention-probability dropout (BERT's attention_probs_dropout_prob) is not applied:
jax.nn.dot_product_attention has none, and its fused kernels are worth more than that regulariser.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import flax.linen as nn
import jax.numpy as jnp

from zoo.models.base import ModelConfig, check, check_choice, check_positive
from zoo.nn import layers
from zoo.nn.attention import padding_mask
from zoo.nn.block import Block
from zoo.nn.layers import gelu_exact as gelu
from zoo.nn.stack import stack_blocks

CLASSIFIERS = ("bert", "roberta", "distilbert")


@dataclass(frozen=True, kw_only=True)
class BertConfig(ModelConfig):
    """BERT encoder: word + position + segment embeddings, post-LN blocks (pre-LN switch), erf GELU."""

    family: ClassVar[str] = "bert"
    vocab_size: int = 30522  # rows of the word embedding; >= the tokenizer's vocabulary (+ 4 specials if it has none)
    max_len: int = 512  # learned positions; the longest sequence the model accepts
    type_vocab_size: int = 2  # segment (token type) embeddings: sentence A / B; 1: one row for every token, segment
    #   ids ignored (RoBERTa); 0: none (DistilBERT)
    position_offset: int = 0  # position-table rows before position 0; > 0 (RoBERTa: its pad id + 1) also numbers
    #   real tokens only, padding taking row offset - 1 (RoBERTa's create_position_ids_from_input_ids)
    num_layers: int = 12  # encoder blocks (L)
    d_model: int = 768  # residual width (D)
    num_heads: int = 12  # attention heads (N); D must divide by N
    d_ff: int = 3072  # MLP hidden width (F)
    dropout: float = 0.1  # on embeddings, residual branches and the pooled [CLS], training only
    ln_eps: float = 1e-12  # LayerNorm epsilon (BERT uses 1e-12)
    pre_ln: bool = False  # LayerNorm before each sublayer (+ a final one) instead of after (BERT)
    classifier: str = "bert"  # the [CLS] head: bert (pooler dense+tanh -> dropout -> out) | roberta (dropout ->
    #   dense+tanh -> dropout -> out_proj) | distilbert (pre_classifier dense+ReLU -> dropout -> classifier)
    num_classes: int = 2  # outputs of the classification head (C; bert_tokens: tags); 0: the label column's count
    #   (bert_cls, bert_tokens); unused by MLM

    def __post_init__(self):
        super().__post_init__()
        check_positive(self, "vocab_size", "max_len", "num_layers", "d_model", "num_heads", "d_ff")
        check(self.type_vocab_size >= 0, f"model.type_vocab_size={self.type_vocab_size} must be >= 0 (0: none)")
        check(self.position_offset >= 0, f"model.position_offset={self.position_offset} must be >= 0")
        check_choice("classifier", self.classifier, CLASSIFIERS)
        check(self.num_classes >= 0, f"model.num_classes={self.num_classes} must be >= 0 (0: from the labels)")
        check(self.d_model % self.num_heads == 0,
              f"model.d_model={self.d_model} is not divisible by model.num_heads={self.num_heads}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

# Google's BERT releases (vocab 30522 WordPiece, 512 positions); counts are HF BertModel's (with pooler).
BERT_BASE = BertConfig()  # 109,482,240 params, as bert-base-uncased
BERT_LARGE = dataclasses.replace(BERT_BASE, num_layers=24, d_model=1024, num_heads=16, d_ff=4096)  # 335,141,888
BERT_TINY = dataclasses.replace(BERT_BASE, num_layers=2, d_model=128, num_heads=2, d_ff=512)  # 4,385,920
BERT_MINI = dataclasses.replace(BERT_BASE, num_layers=4, d_model=256, num_heads=4, d_ff=1024)  # 11,170,560
BERT_SMALL = dataclasses.replace(BERT_BASE, num_layers=4, d_model=512, num_heads=8, d_ff=2048)  # 28,763,648
BERT_MEDIUM = dataclasses.replace(BERT_BASE, num_layers=8, d_model=512, num_heads=8, d_ff=2048)  # 41,373,184
# MiniLM-L6-H384 (sentence-transformers/all-MiniLM-L6-v2): BERT's vocabulary and positions, 6 narrow layers.
MINILM_L6 = dataclasses.replace(BERT_BASE, num_layers=6, d_model=384, num_heads=12, d_ff=1536)  # 22,713,216
PRESETS = {"bert_tiny": BERT_TINY, "bert_mini": BERT_MINI, "bert_small": BERT_SMALL, "bert_medium": BERT_MEDIUM,
           "bert_base": BERT_BASE, "bert_large": BERT_LARGE, "minilm_l6": MINILM_L6}

STD = 0.02  # BERT initialises every weight matrix N(0, 0.02), residual projections included


def _dtypes(cfg: BertConfig) -> dict:
    return dict(dtype=jnp.dtype(cfg.dtype), param_dtype=jnp.dtype(cfg.param_dtype))


class Embeddings(nn.Module):
    """(ids_BT, segment_ids_BT, valid_BT) -> x_BTD: word + position + segment, LayerNorm, dropout. `attend` ties."""

    cfg: BertConfig

    def setup(self):
        cfg, kw = self.cfg, _dtypes(self.cfg)
        self.word = layers.Embed(cfg.vocab_size, cfg.d_model, std=STD, name="word", **kw)
        self.position = self.param("position", layers.normal(STD, (None, "embed")),
                                   (cfg.max_len + cfg.position_offset, cfg.d_model), kw["param_dtype"])
        self.segment = self.param("segment", layers.normal(STD, (None, "embed")), (cfg.type_vocab_size, cfg.d_model),
                                  kw["param_dtype"]) if cfg.type_vocab_size else None
        # Pre-LN stacks normalise inside every block, so their embeddings go in raw (as Megatron-BERT).
        self.ln = None if cfg.pre_ln else layers.layer_norm(cfg.ln_eps, name="ln", **kw)
        self.drop = nn.Dropout(cfg.dropout)

    def __call__(self, ids_BT, segment_ids_BT, valid_BT, deterministic: bool):
        cfg, dtype = self.cfg, jnp.dtype(self.cfg.dtype)
        T, offset = ids_BT.shape[1], cfg.position_offset
        if offset:  # RoBERTa: real tokens numbered from the offset in order, padding at the row below it
            pos_BT = jnp.where(valid_BT, jnp.cumsum(valid_BT, axis=1) - 1 + offset, offset - 1)
            x_BTD = self.word(ids_BT) + jnp.take(self.position, pos_BT, axis=0).astype(dtype)
        else:
            x_BTD = self.word(ids_BT) + self.position[:T].astype(dtype)[None]
        if cfg.type_vocab_size == 1:  # one token type: every token gets it, whatever its segment
            x_BTD = x_BTD + self.segment[0].astype(dtype)
        elif cfg.type_vocab_size:
            x_BTD = x_BTD + jnp.take(self.segment, segment_ids_BT, axis=0).astype(dtype)
        if self.ln is not None:
            x_BTD = self.ln(x_BTD)
        x_BTD = self.drop(x_BTD, deterministic=deterministic)
        return layers.constrain(x_BTD, ("batch", "length", "embed"))

    def attend(self, x_BTD):
        return self.word.attend(x_BTD)


class Encoder(nn.Module):
    """L blocks (params layer_0..layer_{L-1}, or one stacked `layer` when scanned); pre-LN adds final_ln."""

    cfg: BertConfig

    @nn.compact
    def __call__(self, x_BTD, mask_B1TS, deterministic: bool):
        cfg, kw = self.cfg, _dtypes(self.cfg)
        # Post-LN (BERT): x = LN(x + Attn(x)); x = LN(x + Mlp(x)). Pre-LN: x + Attn(LN(x)); x + Mlp(LN(x)).
        blocks = stack_blocks(
            Block, cfg.num_layers, scan=cfg.scan_layers, remat=cfg.remat, remat_policy=cfg.remat_policy,
            name="layer", num_heads=cfg.num_heads, d_ff=cfg.d_ff, dropout=cfg.dropout, ln_eps=cfg.ln_eps,
            pre_ln=cfg.pre_ln, norm_names=("attn_ln", "mlp_ln"), activation=gelu, out_std=STD,
            implementation=cfg.attention_impl, **kw)
        x_BTD = blocks(x_BTD, mask_B1TS, deterministic, False)
        if cfg.pre_ln:
            x_BTD = layers.layer_norm(cfg.ln_eps, name="final_ln", **kw)(x_BTD)
        return x_BTD


class Bert(nn.Module):
    """(ids_BT, segment_ids_BT, valid_BT) -> hidden x_BTD; `attend` is the tied output projection."""

    cfg: BertConfig

    def setup(self):
        self.embed = Embeddings(self.cfg)
        self.encoder = Encoder(self.cfg)

    def __call__(self, ids_BT, segment_ids_BT, valid_BT, deterministic: bool = True):
        # Only keys are masked: a padded query still attends the real keys, so no softmax row is
        # empty (an all-masked row is NaN on some backends) and padding never reaches a real position.
        mask_B1TS = padding_mask(valid_BT, jnp.ones_like(valid_BT))
        return self.encoder(self.embed(ids_BT, segment_ids_BT, valid_BT, deterministic), mask_B1TS, deterministic)

    def attend(self, x_BTD):
        return self.embed.attend(x_BTD)


def _dense(cfg: BertConfig, name: str, eqn: str = "BTD,DE->BTE"):
    # Two distinct logical names: one mesh axis may not split both dims of a [D, D] kernel.
    return layers.Einsum((cfg.d_model, cfg.d_model), ("embed", "mlp"), eqn, std=STD, bias_axes=("mlp",),
                         name=name, **_dtypes(cfg))


class MlmHead(nn.Module):
    """x_BTD -> logits_BTV (float32): dense -> GELU -> LayerNorm -> tied word embedding + bias [V]."""

    cfg: BertConfig

    @nn.compact
    def __call__(self, x_BTD, attend, hidden: bool = False):
        cfg, kw = self.cfg, _dtypes(self.cfg)
        h_BTD = gelu(_dense(cfg, "transform")(x_BTD))
        h_BTD = layers.layer_norm(cfg.ln_eps, name="ln", **kw)(h_BTD)
        bias_V = self.param("bias", layers.zeros(("vocab",)), (cfg.vocab_size,), kw["param_dtype"])
        return h_BTD if hidden else attend(h_BTD) + bias_V.astype(jnp.float32)


def pool(cfg: BertConfig, x_BD):
    """pooled_BD: dense + tanh (DistilBERT: ReLU) on [CLS] x_BD, as a `pooler` submodule of the calling module."""
    act = nn.relu if cfg.classifier == "distilbert" else jnp.tanh
    return act(_dense(cfg, "pooler", "BD,DE->BE")(x_BD))


class Pooler(nn.Module):
    """x_BTD -> pooled_BD alone: the classifier head without its output layer."""

    cfg: BertConfig

    @nn.compact
    def __call__(self, x_BTD):
        return pool(self.cfg, x_BTD[:, 0])


class ClsHead(nn.Module):
    """x_BTD -> logits_BC (float32): pooler (dense + tanh on [CLS]) -> dropout -> dense, zero-initialised;
    RoBERTa's drops [CLS] out before its dense too, DistilBERT's dense is ReLU'd (`pool`)."""

    cfg: BertConfig

    @nn.compact
    def __call__(self, x_BTD, deterministic: bool):
        cfg, kw = self.cfg, _dtypes(self.cfg)
        drop = nn.Dropout(cfg.dropout)
        x_BD = x_BTD[:, 0]
        if cfg.classifier == "roberta":
            x_BD = drop(x_BD, deterministic=deterministic)
        pooled_BD = drop(pool(cfg, x_BD), deterministic=deterministic)
        # std 0: a fresh head predicts the uniform distribution, so fine-tuning starts at loss ln C
        # and the first gradients reach the encoder through a head that has not yet learnt noise.
        logits_BC = layers.Einsum((cfg.d_model, cfg.num_classes), ("embed", None), "BD,DC->BC", std=0.0,
                                  bias_axes=(None,), name="out", **kw)(pooled_BD)
        return logits_BC.astype(jnp.float32)


class BertMlm(nn.Module):
    """Masked-LM: (ids_BT, segment_ids_BT, valid_BT) -> logits_BTV (float32).

    With positions_BK only those K positions of each row go through the head: logits_BKV. With
    hidden=True the head stops before its output layer (h_BKD), for a fused loss (zoo.nn.losses) that
    applies the tied word embedding and params["mlm_head"]["bias"] itself.
    """

    cfg: BertConfig

    @nn.compact
    def __call__(self, ids_BT, segment_ids_BT, valid_BT, *, deterministic: bool = True, positions_BK=None,
                 hidden: bool = False):
        bert = Bert(self.cfg, name="bert")
        x_BTD = bert(ids_BT, segment_ids_BT, valid_BT, deterministic)
        if positions_BK is not None:
            x_BTD = jnp.take_along_axis(x_BTD, positions_BK[..., None], axis=1)
        return MlmHead(self.cfg, name="mlm_head")(x_BTD, bert.attend, hidden)


class BertClassifier(nn.Module):
    """Sequence classification from [CLS]: (ids_BT, segment_ids_BT, valid_BT) -> logits_BC (float32)."""

    cfg: BertConfig

    @nn.compact
    def __call__(self, ids_BT, segment_ids_BT, valid_BT, *, deterministic: bool = True):
        x_BTD = Bert(self.cfg, name="bert")(ids_BT, segment_ids_BT, valid_BT, deterministic)
        return ClsHead(self.cfg, name="cls_head")(x_BTD, deterministic)


class TokenHead(nn.Module):
    """x_BTD -> logits_BTC (float32) at every position: dropout -> dense, zero-initialised (Hugging Face's
    *ForTokenClassification: dropout + `classifier`; no pooler)."""

    cfg: BertConfig

    @nn.compact
    def __call__(self, x_BTD, deterministic: bool):
        cfg = self.cfg
        x_BTD = nn.Dropout(cfg.dropout)(x_BTD, deterministic=deterministic)
        # std 0 as ClsHead's: a fresh head predicts every tag alike, the loss starts at ln C.
        logits_BTC = layers.Einsum((cfg.d_model, cfg.num_classes), ("embed", None), "BTD,DC->BTC", std=0.0,
                                   bias_axes=(None,), name="out", **_dtypes(cfg))(x_BTD)
        return logits_BTC.astype(jnp.float32)


class BertTokenClassifier(nn.Module):
    """Token classification (NER, ...): (ids_BT, segment_ids_BT, valid_BT) -> logits_BTC (float32)."""

    cfg: BertConfig

    @nn.compact
    def __call__(self, ids_BT, segment_ids_BT, valid_BT, *, deterministic: bool = True):
        x_BTD = Bert(self.cfg, name="bert")(ids_BT, segment_ids_BT, valid_BT, deterministic)
        return TokenHead(self.cfg, name="token_head")(x_BTD, deterministic)


class BertEncoder(nn.Module):
    """The bare encoder (Hugging Face's BertModel): (ids_BT, segment_ids_BT, valid_BT) -> (x_BTD, pooled_BD).

    The pooler is named `cls_head` so that its params sit where BertClassifier keeps them.
    """

    cfg: BertConfig

    @nn.compact
    def __call__(self, ids_BT, segment_ids_BT, valid_BT, *, deterministic: bool = True):
        x_BTD = Bert(self.cfg, name="bert")(ids_BT, segment_ids_BT, valid_BT, deterministic)
        return x_BTD, Pooler(self.cfg, name="cls_head")(x_BTD)
