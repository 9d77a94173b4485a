"""Tasks: what the one trainer trains. A Task = model + loss + data, and the trainer never asks which.

  init(rng) -> boxed params (logical axis names attached)
  loss(params, batch, rng, train) -> (loss_sum, aux): sums over the batch plus `weight` (the
      denominator, e.g. target tokens) and `tokens` (input tokens processed, for tokens/s)
  make_data(cfg, process_index, process_count) -> Data(train=step -> local batch, eval=[batches], tokenizer)
  flops_per_token(seq_len) -> training FLOPs per input token (for MFU)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from zoo import data as zdata
from zoo.config import Config


@dataclasses.dataclass(frozen=True)
class Data:
    train: Callable[[int], dict]  # step -> this process's slice of the global batch
    eval: list  # fixed validation batches (this process's slices)
    tokenizer: Any


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    model: Any  # a flax module
    init: Callable
    loss: Callable
    make_data: Callable
    flops_per_token: Callable
    num_params: Callable  # boxed abstract params -> params counted in 6N (positions excluded)


def token_cross_entropy(logits_BTV, targets_BT, weights_BT):
    """Sum of weighted token cross-entropies and of correct argmax predictions (float32)."""
    ce_BT = optax.softmax_cross_entropy_with_integer_labels(logits_BTV.astype(jnp.float32), targets_BT)
    correct_BT = (jnp.argmax(logits_BTV, -1) == targets_BT).astype(jnp.float32)
    return jnp.sum(ce_BT * weights_BT), jnp.sum(correct_BT * weights_BT)


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
        logits_BTV = model.apply({"params": params}, batch["inputs"], deterministic=not train,
                                 rngs={"dropout": rng})
        loss_sum, correct = token_cross_entropy(logits_BTV, batch["targets"], batch["weights"])
        weight = jnp.sum(batch["weights"])
        return loss_sum, {"weight": weight, "correct": correct, "tokens": weight}

    def flops_per_token(seq_len):
        # 6N for the matmuls forward + backward, plus attention scores and values: 12 * L * N*H * T
        # (nanoGPT / PaLM convention: the full T x T square, causal half not discounted).
        n = _count(jax.eval_shape(init, jax.random.PRNGKey(0)), exclude=("wpe",))
        return 6 * n + 12 * m.num_layers * m.num_heads * m.head_dim * seq_len

    return Task("gpt_lm", model, init, loss, lm_data, flops_per_token,
                lambda boxed: _count(boxed, exclude=("wpe",)))


TASKS = {"gpt_lm": gpt_lm}


def build(cfg: Config) -> Task:
    return TASKS[cfg.task](cfg)
