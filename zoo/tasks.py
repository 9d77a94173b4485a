"""Tasks: what the one trainer trains. A Task = model + loss + data, and the trainer never asks which.

  init(rng) -> boxed params (logical axis names attached)
  loss(params, batch, rng, train) -> (loss_sum, aux): sums over the batch plus `weight` (the
      denominator, e.g. target tokens) and `tokens` (input tokens processed, for tokens/s)
  make_data(cfg, process_index, process_count) -> Data(train=step -> local batch, eval=[batches], tokenizer)
  flops_per_token(seq_len) -> training FLOPs per input token (for MFU)
  eval_metrics(totals) -> extra eval metrics from the summed aux (optional; e.g. macro-F1)
  evaluate_extra(params, data) -> extra eval metrics that need more than a loss pass (optional; BLEU)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from zoo import data as zdata
from zoo import losses
from zoo.config import Config


@dataclasses.dataclass(frozen=True)
class Data:
    train: Callable[[int], dict]  # step -> this process's slice of the global batch
    eval: list  # fixed validation batches (this process's slices)
    tokenizer: Any
    files: dict = dataclasses.field(default_factory=dict)  # name -> text to keep beside the run (labels.json)


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    model: Any  # a flax module
    init: Callable
    loss: Callable
    make_data: Callable
    flops_per_token: Callable
    num_params: Callable  # boxed abstract params -> params counted in 6N (positions excluded)
    eval_metrics: Callable | None = None  # summed eval aux -> {name: value}; None: loss and accuracy only
    evaluate_extra: Callable | None = None  # (params, Data) -> {name: value} after each eval (decoding)


def lm_data(cfg: Config, process_index: int, process_count: int) -> Data:
    tokenizer = zdata.get_tokenizer(cfg.data.tokenizer)
    if tokenizer.n_vocab > cfg.model.vocab_size:  # checked before the corpus is tokenized
        raise ValueError(f"model.vocab_size={cfg.model.vocab_size} is smaller than the vocabulary of "
                         f"data.tokenizer={cfg.data.tokenizer!r} ({tokenizer.n_vocab})")
    tokenizer, store = zdata.prepare(cfg.data, tokenizer)
    zdata.check_length(store, cfg.data.seq_len, cfg.data.source)
    train = zdata.Batches(store.train, cfg.data.seq_len, cfg.train.batch_size, cfg.train.seed,
                          process_index, process_count)
    evals = zdata.eval_batches(store.val, cfg.data.seq_len, cfg.train.batch_size, cfg.train.eval_batches,
                               process_index, process_count)
    return Data(train=train, eval=evals, tokenizer=tokenizer)


def _count(boxed, exclude=()):
    flat = jax.tree_util.tree_flatten_with_path(boxed)[0]
    return sum(int(np.prod(x.shape)) for p, x in flat
               if not any(e in jax.tree_util.keystr(p) for e in exclude))


def gpt_lm(cfg: Config) -> Task:
    from zoo.models.gpt import Gpt
    model = Gpt(cfg.model)
    m = cfg.model

    def init(rng):
        return model.init(rng, jnp.zeros((1, cfg.data.seq_len), jnp.int32))["params"]

    def loss(params, batch, rng, train):
        h_BTD = model.apply({"params": params}, batch["inputs"], deterministic=not train, hidden=True,
                            rngs={"dropout": rng})
        loss_sum, correct = losses.linear_cross_entropy(h_BTD, params["wte"]["embedding"], batch["targets"],
                                                        batch["weights"])
        weight = jnp.sum(batch["weights"])
        return loss_sum, {"weight": weight, "correct": correct, "tokens": weight}

    def flops_per_token(seq_len):
        # 6N for the matmuls forward + backward, plus attention scores and values: 12 * L * N*H * T
        # (nanoGPT / PaLM convention: the full T x T square, causal half not discounted).
        n = _count(jax.eval_shape(init, jax.random.PRNGKey(0)), exclude=("wpe",))
        return 6 * n + 12 * m.num_layers * m.num_heads * m.head_dim * seq_len

    return Task("gpt_lm", model, init, loss, lm_data, flops_per_token,
                lambda boxed: _count(boxed, exclude=("wpe",)))


def _encoder_flops(init, m, exclude):
    n = _count(jax.eval_shape(init, jax.random.PRNGKey(0)), exclude=exclude)
    # 6N for the matmuls (embedding lookups excluded) plus attention scores and values over the full,
    # non-causal T x T square: 12 * L * N*H * T.
    return lambda seq_len: 6 * n + 12 * m.num_layers * m.num_heads * m.head_dim * seq_len


def _bert_init(model, seq_len):
    def init(rng):
        ids = jnp.zeros((1, seq_len), jnp.int32)
        return model.init(rng, ids, ids, jnp.ones((1, seq_len), bool))["params"]
    return init


def bert_mlm(cfg: Config) -> Task:
    """Masked-LM pretraining: loss and accuracy on the chosen positions only (weight = their count)."""
    from zoo import mlm
    from zoo.models.bert import BertMlm
    model = BertMlm(cfg.model)
    init = _bert_init(model, cfg.data.seq_len)

    def loss(params, batch, rng, train):
        # The head and the [V]-wide output run on the K chosen positions only (BERT's masked_lm_positions).
        pos_BK = batch["positions"]
        h_BKD = model.apply({"params": params}, batch["inputs"], batch["segment_ids"], batch["valid"],
                            deterministic=not train, positions_BK=pos_BK, hidden=True, rngs={"dropout": rng})
        pick = lambda x_BT: jnp.take_along_axis(x_BT, pos_BK, axis=1)
        loss_sum, correct = losses.linear_cross_entropy(
            h_BKD, params["bert"]["embed"]["word"]["embedding"], pick(batch["targets"]), pick(batch["weights"]),
            bias_V=params["mlm_head"]["bias"])
        return loss_sum, {"weight": jnp.sum(batch["weights"]), "correct": correct,
                          "tokens": jnp.sum(batch["valid"].astype(jnp.float32))}

    # The word embedding stays in 6N: it is also the (tied) output matmul. That matmul and the head's
    # transform run on K of T positions, so they count K/T per token.
    exclude = ("['position']", "['segment']")
    boxed = jax.eval_shape(init, jax.random.PRNGKey(0))
    head = _count(boxed["mlm_head"]) + _count(boxed["bert"]["embed"]["word"])
    encoder_flops = _encoder_flops(init, cfg.model, exclude)

    def flops_per_token(seq_len):
        return encoder_flops(seq_len) - 6 * head * (1 - mlm.max_predictions(seq_len) / seq_len)

    return Task("bert_mlm", model, init, loss, mlm.mlm_data, flops_per_token,
                lambda boxed: _count(boxed, exclude=exclude))


def macro_f1(totals: dict, num_classes: int) -> dict:
    """Macro-F1 over the classes present in labels or predictions, from summed per-class counts."""
    f1s = []
    for c in range(num_classes):
        tp, pred, true = (totals.get(f"{k}_{c}", 0.0) for k in ("tp", "pred", "true"))
        if pred + true > 0:
            f1s.append(2 * tp / (pred + true))
    return {"eval_macro_f1": sum(f1s) / len(f1s) if f1s else 0.0}


def bert_cls(cfg: Config) -> Task:
    """[CLS] classification: one label per example (weight = examples); per-class sums for macro-F1."""
    from zoo import classify_data
    from zoo.models.bert import BertClassifier
    model = BertClassifier(cfg.model)
    init = _bert_init(model, cfg.data.seq_len)
    C = cfg.model.num_classes

    def loss(params, batch, rng, train):
        logits_BC = model.apply({"params": params}, batch["inputs"], batch["segment_ids"], batch["valid"],
                                deterministic=not train, rngs={"dropout": rng})
        labels_B, w_B = batch["labels"], batch["weights"]
        ce_B = optax.softmax_cross_entropy_with_integer_labels(logits_BC, labels_B)
        pred_B = jnp.argmax(logits_BC, -1)
        pred_C = jnp.sum(jax.nn.one_hot(pred_B, C) * w_B[:, None], 0)
        true_BC = jax.nn.one_hot(labels_B, C) * w_B[:, None]
        tp_C = jnp.sum(true_BC * jax.nn.one_hot(pred_B, C), 0)
        # Scalars, one per class and count: the trainer sums every aux value as a float.
        per_class = {f"{k}_{c}": v[c] for k, v in (("tp", tp_C), ("pred", pred_C), ("true", jnp.sum(true_BC, 0)))
                     for c in range(C)}
        return jnp.sum(ce_B * w_B), {"weight": jnp.sum(w_B), "correct": jnp.sum((pred_B == labels_B) * w_B),
                                     "tokens": jnp.sum(batch["valid"] * w_B[:, None]), **per_class}

    # Lookups only here: no output matmul ties the word embedding in.
    exclude = ("['position']", "['segment']", "['word']")
    return Task("bert_cls", model, init, loss, classify_data.cls_data, _encoder_flops(init, cfg.model, exclude),
                lambda boxed: _count(boxed, exclude=exclude), eval_metrics=lambda totals: macro_f1(totals, C))


def bert_encoder(cfg: Config) -> Task:
    """A converted bare BertModel (MiniLM, ...): hidden states and pooled [CLS], no objective of its own.
    It is a starting point: fine-tune it with task=bert_cls (or bert_mlm) and init_from=<this run>."""
    from zoo.config import ConfigError
    from zoo.models.bert import BertEncoder
    model = BertEncoder(cfg.model)
    init = _bert_init(model, cfg.data.seq_len)

    def no_objective(*_):
        raise ConfigError("task=bert_encoder has no training objective; train a bert_cls or bert_mlm config "
                          "with --set init_from=<this run> instead")

    exclude = ("['position']", "['segment']", "['word']")
    return Task("bert_encoder", model, init, no_objective, no_objective, _encoder_flops(init, cfg.model, exclude),
                lambda boxed: _count(boxed, exclude=exclude))


def seq2seq(cfg: Config) -> Task:
    """Encoder-decoder, teacher forcing: loss on the non-pad target tokens (weight = their count).

    Label smoothing (model.label_smoothing) applies to the training loss only, so eval loss and
    perplexity are plain cross-entropy. `tokens` counts source + target tokens.
    """
    from zoo import bleu, seq2seq_data
    from zoo.models.encdec import EncDec, output_projection
    model, m, T = EncDec(cfg.model), cfg.model, cfg.data.seq_len

    def init(rng):
        ids = jnp.zeros((1, T), jnp.int32)
        return model.init(rng, ids, jnp.ones((1, T), bool), ids)["params"]

    def loss(params, batch, rng, train):
        h_BTD = model.apply({"params": params}, batch["src"], batch["src_valid"], batch["tgt_in"],
                            deterministic=not train, hidden=True, rngs={"dropout": rng})
        w_BT, tgt_BT = batch["weights"], batch["tgt_out"]
        w_VD, bias_V = output_projection(m, params)
        loss_sum, correct = losses.linear_cross_entropy(h_BTD, w_VD, tgt_BT, w_BT, bias_V=bias_V,
                                                        label_smoothing=m.label_smoothing if train else 0.0)
        tokens = jnp.sum(batch["src_valid"].astype(jnp.float32)) + jnp.sum(w_BT)
        return loss_sum, {"weight": jnp.sum(w_BT), "correct": correct, "tokens": tokens}

    exclude = ("['position']",)  # learned position tables are lookups; the (tied) embedding is the output matmul
    n = _count(jax.eval_shape(init, jax.random.PRNGKey(0)), exclude=exclude)

    def flops_per_token(seq_len):
        # Per source + target token with S = T = seq_len: each token meets half the params (encoder or
        # decoder), 6N/2, plus attention scores and values over full squares: encoder self, decoder self
        # and cross, 12 * N*H * T * (L_enc + 2 L_dec) per pair of tokens.
        return 3 * n + 6 * m.num_heads * m.head_dim * seq_len * (m.num_encoder_layers + 2 * m.num_decoder_layers)

    return Task("seq2seq", model, init, loss, seq2seq_data.seq2seq_data, flops_per_token,
                lambda boxed: _count(boxed, exclude=exclude),
                evaluate_extra=lambda params, data: bleu.validation_scores(model, params, data, cfg))


TASKS = {"gpt_lm": gpt_lm, "bert_mlm": bert_mlm, "bert_cls": bert_cls, "bert_encoder": bert_encoder,
         "seq2seq": seq2seq}


def build(cfg: Config) -> Task:
    return TASKS[cfg.task](cfg)
