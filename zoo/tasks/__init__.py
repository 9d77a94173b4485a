"""Tasks: model + loss + data pipeline + metrics, one module per objective (lm, mlm, classify, seq2seq).
`build(cfg)` finds the task through the FAMILIES registry (zoo.models); `base` holds the protocol."""

from __future__ import annotations

from zoo.models import FAMILIES, TASK_FAMILY
from zoo.models.base import resolve
from zoo.tasks.base import Data, Task

__all__ = ["Data", "Task", "build"]


def build(cfg) -> Task:
    return resolve(FAMILIES[TASK_FAMILY[cfg.task]].tasks[cfg.task])(cfg)
