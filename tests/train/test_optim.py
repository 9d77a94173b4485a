"""Schedules equal their formulas; weight decay touches only matrices."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zoo.training import optim
from zoo.errors import ConfigError
from zoo.configuration import OptimConfig

TOTAL, LR = 1000, 1e-3
STEPS = [0, 1, 50, 99, 100, 101, 500, 799, 800, 900, 999, 1000]


def reference(name, k, W, m=0.1, decay_fraction=0.2, d_model=512):
    if name == "noam":
        s = k + 1
        return LR * d_model ** -0.5 * min(s ** -0.5, s * W ** -1.5)
    if k < W:
        return LR * k / W
    p = min((k - W) / (TOTAL - W), 1.0)
    if name == "cosine":
        return LR * (m + (1 - m) * 0.5 * (1 + math.cos(math.pi * p)))
    if name == "linear":
        return LR * (1 - p)
    if name == "constant":
        return LR
    if name == "wsd":
        start = TOTAL - decay_fraction * TOTAL
        q = min(max((k - start) / (decay_fraction * TOTAL), 0.0), 1.0)
        return LR * (1 - (1 - m) * q)
    raise AssertionError(name)


@pytest.mark.parametrize("name", sorted(optim.SCHEDULES))
@pytest.mark.parametrize("warmup", [100, 0.1])
def test_schedule_matches_formula(name, warmup):
    cfg = OptimConfig(lr=LR, schedule=name, warmup=warmup, min_lr_ratio=0.1, decay_fraction=0.2)
    f = optim.make_schedule(cfg, TOTAL, d_model=512)
    W = 100  # 0.1 of 1000 steps resolves to the same 100 steps
    for k in STEPS:
        assert float(f(k)) == pytest.approx(reference(name, k, W), rel=1e-4, abs=1e-12), (name, k)  # float32 arithmetic


def test_noam_peaks_at_warmup():
    f = optim.make_schedule(OptimConfig(lr=1.0, schedule="noam", warmup=4000), 100_000, d_model=512)
    peak = float(f(3999))  # step = k + 1 = 4000 = warmup
    assert peak == pytest.approx(512 ** -0.5 * 4000 ** -0.5, rel=1e-5)
    assert float(f(3998)) < peak and float(f(4000)) < peak


def test_noam_without_warmup_is_refused():
    with pytest.raises(ConfigError, match="noam"):
        optim.make_schedule(OptimConfig(schedule="noam", warmup=0), 100, d_model=512)


def test_decay_mask_skips_vectors_even_when_scanned():
    boxed = {
        "kernel": nn.Partitioned(jnp.zeros((4, 4)), ("embed", "mlp")),
        "bias": nn.Partitioned(jnp.zeros((4,)), ("mlp",)),
        "stacked_scale": nn.Partitioned(jnp.zeros((3, 4)), ("layers", "embed")),
        "stacked_kernel": nn.Partitioned(jnp.zeros((3, 4, 4)), ("layers", "embed", "mlp")),
    }
    assert optim.decay_mask(boxed) == {"kernel": True, "bias": False, "stacked_scale": False,
                                       "stacked_kernel": True}


def test_weight_decay_applies_only_where_masked():
    params = {"w": jnp.ones((2, 2)), "b": jnp.ones((2,))}
    cfg = OptimConfig(lr=0.1, schedule="constant", warmup=0, weight_decay=0.5, clip_norm=0)
    tx = optim.make_optimizer(cfg, optim.make_schedule(cfg, 10, 8), {"w": True, "b": False})
    zero = jax.tree.map(jnp.zeros_like, params)
    updates, _ = tx.update(zero, tx.init(params), params)
    np.testing.assert_allclose(updates["w"], -0.1 * 0.5 * np.ones((2, 2)), rtol=1e-6)
    np.testing.assert_array_equal(updates["b"], np.zeros(2))


def test_a_warmup_as_long_as_the_run_is_warned_of():
    """optim.warmup > train.steps keeps the rate below optim.lr for the whole run: one warning line (the trainer
    prints it as training starts)."""
    assert optim.warmup_warning(OptimConfig(lr=1e-3, schedule="cosine", warmup=500), 300) == (
        "warning: optim.warmup=500 is 500 steps, more than train.steps=300: the learning rate never reaches "
        "optim.lr=0.001; set optim.warmup to a fraction (e.g. 0.05) or fewer steps")
    assert optim.warmup_warning(OptimConfig(lr=1e-3, schedule="cosine", warmup=0.05), 300) is None
    assert optim.warmup_warning(OptimConfig(lr=1e-3, schedule="cosine", warmup=300), 300) is None
