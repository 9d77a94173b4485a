"""Tasks: model + loss + data pipeline + metrics, one module per objective (lm, sft, mlm, classify,
token_classify, seq2seq).
`build(cfg)` finds the task through the FAMILIES registry (zoo.models), wrapped with LoRA adapters when the
model config asks for them (`adapted`); `base` holds the protocol."""

from __future__ import annotations

from zoo import runtime
from zoo.models import FAMILIES
from zoo.models.base import resolve
from zoo.tasks import distill
from zoo.tasks.adapted import AdaptedTask
from zoo.tasks.base import Data, Task

__all__ = ["Data", "Task", "build", "check_data", "plain"]


def plain(cfg) -> Task:
    """The task of cfg without adapters: the family's own model, as a run's merged weights fit it."""
    return resolve(FAMILIES[cfg.model.family].tasks[cfg.task])(cfg)


def build(cfg) -> Task:
    """The task of cfg; with model.lora_rank, its model carries LoRA adapters (zoo.tasks.adapted)."""
    spec = cfg.model.lora_spec
    return plain(cfg) if spec is None else AdaptedTask(plain(cfg), spec)


def check_data(cfg, vocab: bool = True):
    """cfg's data checked against what its task reads (the source opens; columns, labels and tokenizer fit)
    before any model is built, converted or compiled; returns cfg with what the data decides filled in
    (bert_cls with model.num_classes=0: the number of labels). vocab=False leaves out the tokenizer (a
    checkpoint not yet converted has none to check against)."""
    runtime.check_cache_dir(cfg.data.cache_dir)
    if cfg.distill.teacher:  # a source zoo.load reads (its vocabulary is checked as it loads: zoo.tasks.distill)
        distill.check_source(cfg.distill.teacher)
    return resolve(FAMILIES[cfg.model.family].tasks[cfg.task]).check_data(cfg, vocab)

