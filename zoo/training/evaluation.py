"""The evaluation pass the training loop runs every train.eval_every steps: a batch laid out over the mesh's data
axes (`to_device`, also how the loop feeds its steps) and the eval step's sums over the eval batches turned into
loss, perplexity, accuracy and the task's own metrics (`evaluate`)."""

from __future__ import annotations

import math

import jax
import numpy as np

from zoo.training import sharding


def to_device(batch: dict, mesh) -> dict:
    """This process's rows -> one global array per key, split over the data axes."""
    sh = sharding.batch_sharding(mesh)
    return {k: jax.make_array_from_process_local_data(sh, np.asarray(v)) for k, v in batch.items()}


def evaluate(eval_fn, params, batches, mesh, extra=None, perplexity: bool = True) -> dict:
    """Loss, perplexity (unless `perplexity` is False: a task whose loss is not per token, such as
    classification) and accuracy from summed aux over the eval batches; `extra(totals)` adds a task's
    own metrics computed from the same sums (e.g. macro-F1 from per-class counts)."""
    totals: dict = {}
    for b in batches:
        out = jax.device_get(eval_fn(params, to_device(b, mesh)))
        for k, v in out.items():
            totals[k] = totals.get(k, 0.0) + float(v)
    if not totals:  # a task scored by its extra evaluation alone (grpo: held-out prompts answered and rewarded)
        return {}
    loss = totals["loss_sum"] / max(totals["weight"], 1e-9)
    metrics = {"eval_loss": loss}
    if perplexity:
        metrics["eval_ppl"] = math.exp(min(loss, 50.0))
    metrics["eval_accuracy"] = totals.get("correct", 0.0) / max(totals["weight"], 1e-9)
    if extra is not None:
        metrics.update(extra(totals))
    return metrics
