"""train.label_smoothing reaches the training loss of the LM and MLM tasks, and never the eval loss."""

import flax.linen as nn
import jax
import numpy as np
import pytest

from conftest import replace
from tests.helpers import plain_losses, tiny_configs
from zoo import tasks


@pytest.mark.parametrize("model", ["gpt_lm", "llama_lm"])  # tied output; an untied lm_head
def test_lm_training_loss_is_smoothed_cross_entropy(cache_dir, model):
    cfg = replace(tiny_configs.TINY[model](cache_dir), train=dict(label_smoothing=0.2), model=dict(dropout=0.0))
    task = tasks.build(cfg)
    params = nn.unbox(jax.jit(task.init)(jax.random.PRNGKey(0)))  # jitted: one program, not one per op
    batch = task.make_data(cfg, 0, 1).train(0)
    logits = jax.jit(lambda p, x: task.model.apply({"params": p}, x))(params, batch["inputs"])
    rng, loss = jax.random.PRNGKey(1), jax.jit(task.loss, static_argnums=3)
    np.testing.assert_allclose(loss(params, batch, rng, True)[0], jax.jit(plain_losses.smoothed_cross_entropy)(
        logits, batch["targets"], batch["weights"], 0.2), rtol=1e-5)
    np.testing.assert_allclose(loss(params, batch, rng, False)[0], jax.jit(plain_losses.token_cross_entropy)(
        logits, batch["targets"], batch["weights"])[0], rtol=1e-5)


@pytest.mark.parametrize("task_name", ["gpt_lm", "bert_mlm"])
def test_smoothing_changes_the_training_loss_only(cache_dir, task_name):
    cfg = replace(tiny_configs.TINY[task_name](cache_dir), model=dict(dropout=0.0))
    plain, smoothed = tasks.build(cfg), tasks.build(replace(cfg, train=dict(label_smoothing=0.2)))
    params = nn.unbox(jax.jit(plain.init)(jax.random.PRNGKey(0)))
    batch, rng = plain.make_data(cfg, 0, 1).train(0), jax.random.PRNGKey(1)
    plain_loss, smoothed_loss = (jax.jit(t.loss, static_argnums=3) for t in (plain, smoothed))
    np.testing.assert_allclose(smoothed_loss(params, batch, rng, False)[0], plain_loss(params, batch, rng, False)[0])
    assert not np.isclose(smoothed_loss(params, batch, rng, True)[0], plain_loss(params, batch, rng, True)[0])
