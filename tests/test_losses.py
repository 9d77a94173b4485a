"""The fused output-projection cross-entropy (zoo.losses) against the plain [B, T, V] computation."""

import jax
import jax.numpy as jnp
import flax.linen as nn
import numpy as np
import pytest

from tests.helpers import plain_losses
from zoo import losses, mlm, tasks
from tests.conftest import replace
from tests.test_mlm import mlm_cfg


def _inputs(B=3, T=8, D=16, V=50, seed=0):
    k = jax.random.split(jax.random.PRNGKey(seed), 5)
    return (jax.random.normal(k[0], (B, T, D)), jax.random.normal(k[1], (V, D)) * 0.3,
            jax.random.normal(k[2], (V,)), jax.random.randint(k[3], (B, T), 0, V),
            (jax.random.uniform(k[4], (B, T)) > 0.3).astype(jnp.float32))


def _plain(h, w, bias, t, wt, smoothing):
    z = jnp.einsum("BTD,VD->BTV", h, w) + (0.0 if bias is None else bias)
    loss, correct = plain_losses.token_cross_entropy(z, t, wt)
    if smoothing:
        loss = plain_losses.smoothed_cross_entropy(z, t, wt, smoothing)
    return loss, correct


@pytest.mark.parametrize("chunks", [1, 2, 4])
@pytest.mark.parametrize("smoothing,with_bias", [(0.0, False), (0.0, True), (0.1, True)])
def test_loss_and_gradients_equal_the_plain_computation(chunks, smoothing, with_bias):
    h, w, bias, t, wt = _inputs()
    bias = bias if with_bias else None
    h = h + 2 * w[t]  # the target's logit raised, so that some predictions are right (the count is checked)
    fused = lambda h, w, b: losses.linear_cross_entropy(h, w, t, wt, bias_V=b, label_smoothing=smoothing,
                                                        chunks=chunks)
    plain = lambda h, w, b: _plain(h, w, b, t, wt, smoothing)
    (l1, c1), (l0, c0) = fused(h, w, bias), plain(h, w, bias)
    assert 1 <= float(c0) < float(wt.sum()) and float(c1) == float(c0)
    np.testing.assert_allclose(l1, l0, rtol=1e-6)
    argnums = (0, 1, 2) if with_bias else (0, 1)
    g1 = jax.grad(lambda *a: 2.5 * fused(*a)[0], argnums)(h, w, bias)
    g0 = jax.grad(lambda *a: 2.5 * plain(*a)[0], argnums)(h, w, bias)
    for a, b in zip(g1, g0):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_chunks_keep_the_logits_from_existing_whole():
    B, T, D, V = 4, 64, 32, 4096
    h, w, _, t, wt = _inputs(B, T, D, V)
    logits_bytes = B * T * V * 4

    def temp_bytes(chunks):
        grad = jax.jit(jax.grad(lambda h, w: losses.linear_cross_entropy(h, w, t, wt, chunks=chunks)[0], (0, 1)))
        return grad.lower(h, w).compile().memory_analysis().temp_size_in_bytes

    assert temp_bytes(1) >= logits_bytes  # the control: one chunk holds [B, T, V]
    assert temp_bytes(8) < logits_bytes / 2
    assert losses.num_chunks(B, T, V, chunk_bytes=logits_bytes // 8) == 8


def test_chunks_must_divide_the_length():
    h, w, _, t, wt = _inputs()
    with pytest.raises(ValueError, match="chunks=3 does not divide the length 8"):
        losses.linear_cross_entropy(h, w, t, wt, chunks=3)


def test_bert_mlm_loss_on_the_chosen_positions_equals_full_logits(cache_dir):
    """The task's loss (head on K gathered positions, fused output) against logits at every position."""
    cfg = replace(mlm_cfg(cache_dir), train=dict(batch_size=4))
    task = tasks.build(cfg)
    batch = task.make_data(cfg, 0, 1).train(3)
    params = nn.unbox(task.init(jax.random.PRNGKey(0)))
    params["mlm_head"]["bias"] = jax.random.normal(jax.random.PRNGKey(1), params["mlm_head"]["bias"].shape)

    def full(p):
        logits = task.model.apply({"params": p}, batch["inputs"], batch["segment_ids"], batch["valid"])
        return plain_losses.token_cross_entropy(logits, batch["targets"], batch["weights"])

    (l1, aux), g1 = jax.value_and_grad(task.loss, has_aux=True)(params, batch, jax.random.PRNGKey(0), False)
    (l0, c0), g0 = jax.value_and_grad(full, has_aux=True)(params)
    assert batch["positions"].shape[1] == mlm.max_predictions(64) < 64
    np.testing.assert_allclose(l1, l0, rtol=1e-5)
    assert float(aux["correct"]) == float(c0) and float(aux["weight"]) == batch["weights"].sum()
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), g1, g0)
