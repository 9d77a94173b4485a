"""Sequence to sequence (seq2seq) on the encoder-decoder: teacher-forced loss on the target tokens, and
BLEU / exact match of greedy decoding after each evaluation. The data pipeline (framing, pairs,
batches) is zoo.tasks.seq2seq_data."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from zoo.data.tokenizers import get_tokenizer
from zoo.infer import bleu
from zoo.models.encdec import EncDec, output_projection
from zoo.nn import losses
from zoo.tasks.base import BaseTask, Data, count
from zoo.tasks.seq2seq_data import (Seq2SeqBatches, check_framing, eval_batches, framing, pair_chunks,
                                    split_pairs)


class Seq2SeqTask(BaseTask):
    """Loss on the non-pad target tokens (weight = their count). Label smoothing (train.label_smoothing)
    applies to the training loss only, so eval loss and perplexity are plain cross-entropy. `tokens`
    counts source + target tokens."""

    name = "seq2seq"
    UNIFORM_OVER_VOCAB = True
    EXCLUDE = ("['position']",)  # learned position tables are lookups; the (tied) embedding is the output matmul

    def __init__(self, cfg):
        self.cfg, self.model = cfg, EncDec(cfg.model)

    def init(self, rng):
        ids = jnp.zeros((1, self.cfg.data.seq_len), jnp.int32)
        return self.model.init(rng, ids, jnp.ones(ids.shape, bool), ids)["params"]

    def loss(self, params, batch, rng, train):
        m = self.cfg.model
        h_BTD = self.model.apply({"params": params}, batch["src"], batch["src_valid"], batch["tgt_in"],
                                 deterministic=not train, hidden=True, rngs={"dropout": rng})
        w_BT, tgt_BT = batch["weights"], batch["tgt_out"]
        w_VD, bias_V = output_projection(m, params)
        loss_sum, correct = losses.linear_cross_entropy(h_BTD, w_VD, tgt_BT, w_BT, bias_V=bias_V,
                                                        label_smoothing=self.cfg.train.label_smoothing if train else 0.0)
        tokens = jnp.sum(batch["src_valid"].astype(jnp.float32)) + jnp.sum(w_BT)
        return loss_sum, {"weight": jnp.sum(w_BT), "correct": correct, "tokens": tokens}

    def flops_per_token(self, seq_len, target_len=None):
        """Training FLOPs per source + target token for sources of seq_len tokens and targets of
        target_len (default seq_len, the training batches' bound). The encoder's params meet the source
        tokens and the rest (decoder, the tied embedding as output matmul) the target tokens, 6N each;
        attention scores and values cover full squares: encoder self S x S, decoder self T x T and cross
        T x S per layer, 12 * N*H each. With S = T this is 3N + 6 * N*H * T * (L_enc + 2 L_dec)."""
        m = self.cfg.model
        S, T = seq_len, target_len or seq_len
        shapes = jax.eval_shape(self.init, jax.random.PRNGKey(0))
        n_enc = count(shapes["encoder"], exclude=self.EXCLUDE)
        n_dec = count(shapes, exclude=self.EXCLUDE) - n_enc
        attn = 12 * m.num_heads * m.head_dim * (m.num_encoder_layers * S * S + m.num_decoder_layers * (T * T + T * S))
        return (6 * n_enc * S + 6 * n_dec * T + attn) / (S + T)

    @classmethod
    def check_data(cls, cfg, vocab: bool = True):
        tokenizer = get_tokenizer(cfg.data.tokenizer) if vocab else None
        if vocab:
            check_framing(cfg.model, tokenizer)
        if vocab or cfg.data.source != "builtin":  # the built-in pairs are cut to the tokenizer's lengths
            next(pair_chunks(cfg.data, tokenizer, chunk=1000), None)  # the columns, and the first rows' texts
        return cfg

    def make_data(self, cfg, process_index: int, process_count: int) -> Data:
        tokenizer = get_tokenizer(cfg.data.tokenizer)
        sp = check_framing(cfg.model, tokenizer)
        train, val = split_pairs(cfg, tokenizer, sp)
        d, t = cfg.data, cfg.train
        return Data(train=Seq2SeqBatches(train, sp, d.seq_len, t.batch_size, t.seed, process_index, process_count),
                    eval=eval_batches(val, sp, d.seq_len, t.batch_size, t.eval_batches, process_index, process_count),
                    tokenizer=tokenizer, rows=len(train))

    def evaluate_extra(self, params, data: Data) -> dict:
        return bleu.evaluate(self.model, params, data.eval, data.tokenizer, framing(data.tokenizer),
                             self.cfg.data.seq_len)
