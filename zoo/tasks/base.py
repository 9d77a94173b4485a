"""The Task protocol: what the one trainer trains, and the Data a task hands it. The trainer never asks
which task or family it has.

A task is built from a Config and owns its model, loss, data pipeline and metrics:

  init(rng) -> boxed params (logical axis names attached)
  loss(params, batch, rng, train) -> (loss_sum, aux): sums over the batch plus `weight` (the
      denominator, e.g. target tokens) and `tokens` (input tokens processed, for tokens/s)
  check_data(cfg) -> cfg (a classmethod): the source opened and its columns, labels and tokenizer checked
      before any model is built, and what the data decides filled in (bert_cls: model.num_classes=0)
  make_data(cfg, process_index, process_count) -> Data(train=step -> local batch, eval=[batches], tokenizer)
  flops_per_token(seq_len) -> training FLOPs per input token (for MFU); seq2seq also takes target_len
  num_params(boxed) -> params counted in 6N (lookup tables such as learned positions excluded)
  eval_metrics(totals) -> extra eval metrics from the summed aux (e.g. macro-F1)
  train_metrics(totals) -> extra training metrics from the summed aux of the steps logged (dpo's rewards/...)
  prepare_data(params_of, workdir, resume) -> what a task computes from the params the run starts from
      (`params_of()`, asked only when needed) before its data is built (sft's data.mix_source=replay: the base's
      answers); nothing for most
  prepare(params, data, workdir, resume, mesh) -> what a task computes once from the initial params before the
      first step (dpo's precomputed reference log-probabilities); nothing for most
  evaluate_extra(params, data) -> extra eval metrics that need more than a loss pass (e.g. BLEU)
  sample(params, tokenizer, prompt, max_new_tokens) -> a continuation of prompt, or None (no text generation)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class Data:
    train: Callable[[int], dict]  # step -> this process's slice of the global batch
    eval: list  # fixed validation batches (this process's slices)
    tokenizer: Any
    files: dict = dataclasses.field(default_factory=dict)  # name -> text to keep beside the run (labels.json)
    rows: int = 0  # training rows in one epoch, all processes together (train.epochs counts them); 0: unknown
    packed_examples: int = 0  # examples laid into those rows when several share a row (packing); 0: one a row
    answers: list = dataclasses.field(default_factory=list)  # held-out prompts and answers scored by generation
    examples: dict = dataclasses.field(default_factory=dict)  # encoded examples a task reads once more (dpo)


class Task(Protocol):
    name: str
    model: Any  # a flax module

    def init(self, rng) -> Any: ...

    def loss(self, params, batch: dict, rng, train: bool) -> tuple[Any, dict]: ...

    def make_data(self, cfg, process_index: int, process_count: int) -> Data: ...

    def flops_per_token(self, seq_len: int) -> float: ...

    def num_params(self, boxed) -> int: ...

    def eval_metrics(self, totals: dict) -> dict: ...

    def evaluate_extra(self, params, data: Data) -> dict: ...

    def sample(self, params, tokenizer, prompt: str, max_new_tokens: int) -> str | None: ...


class BaseTask:
    """Defaults for the optional parts of a Task: no extra metrics. `EXCLUDE` names the params that are
    lookups, not matmuls (substrings of their paths), left out of 6N. `PERPLEXITY`: whether exp(eval
    loss) means something (a per-token loss); False leaves eval_ppl out of the metrics."""

    name = ""
    EXCLUDE: tuple = ()
    PERPLEXITY: bool = True
    # Whether the loss is a cross-entropy over model.vocab_size tokens: ln(vocab) is then the loss of a model
    # that outputs the uniform distribution, which the spike guard never calls good (zoo.training.guard).
    UNIFORM_OVER_VOCAB: bool = False

    @classmethod
    def check_data(cls, cfg, vocab: bool = True):
        return cfg

    def num_params(self, boxed) -> int:
        return count(boxed, exclude=self.EXCLUDE)

    def eval_metrics(self, totals: dict) -> dict:
        return {}

    def train_metrics(self, totals: dict) -> dict:
        return {}

    def prepare_data(self, params_of, workdir: str, resume: bool) -> None:
        return None

    def prepare(self, params, data: Data, workdir: str, resume: bool, mesh) -> None:
        return None

    def evaluate_extra(self, params, data: Data) -> dict:
        return {}

    def sample(self, params, tokenizer, prompt: str, max_new_tokens: int) -> str | None:
        return None


def count(boxed, exclude=()) -> int:
    """Number of parameters in a (boxed or abstract) tree, leaving out paths containing any of `exclude`."""
    flat = jax.tree_util.tree_flatten_with_path(boxed)[0]
    return sum(int(np.prod(x.shape)) for p, x in flat
               if not any(e in jax.tree_util.keystr(p) for e in exclude))


def attention_flops(num_layers: int, num_heads: int, head_dim: int, seq_len: int) -> int:
    """Attention scores and values per token, forward + backward, over the full T x T square (nanoGPT /
    PaLM convention: the causal half is not discounted): 12 * L * N*H * T."""
    return 12 * num_layers * num_heads * head_dim * seq_len
