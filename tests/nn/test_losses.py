"""The fused output-projection cross-entropy (zoo.nn.losses) against the plain [B, T, V] computation,
whose label smoothing is checked against optax. The BERT MLM task's loss: tests/tasks/test_mlm_task.py."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.helpers import plain_losses
from zoo.nn import losses


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


@pytest.mark.parametrize("chunks,multiple", [(1, 1), (2, 1), (4, 1), (1, 16), (2, 16)])
@pytest.mark.parametrize("smoothing,with_bias", [(0.0, False), (0.0, True), (0.1, True)])
def test_loss_and_gradients_equal_the_plain_computation(chunks, multiple, smoothing, with_bias):
    """multiple 16: the vocab of 50 padded to 64 in the matmuls, as on a GPU (masked logits, the gradients
    of the parameters in their own shapes)."""
    h, w, bias, t, wt = _inputs()
    bias = bias if with_bias else None
    h = h + 2 * w[t]  # the target's logit raised, so that some predictions are right (the count is checked)
    # Both sides jitted: one compile each, not one per op.
    fused = jax.jit(lambda h, w, b: losses.linear_cross_entropy(h, w, t, wt, bias_V=b, label_smoothing=smoothing,
                                                                chunks=chunks, vocab_multiple=multiple))
    plain = jax.jit(lambda h, w, b: _plain(h, w, b, t, wt, smoothing))
    (l1, c1), (l0, c0) = fused(h, w, bias), plain(h, w, bias)
    assert 1 <= float(c0) < float(wt.sum()) and float(c1) == float(c0)
    np.testing.assert_allclose(l1, l0, rtol=1e-6)
    argnums = (0, 1, 2) if with_bias else (0, 1)
    g1 = jax.jit(jax.grad(lambda *a: 2.5 * fused(*a)[0], argnums))(h, w, bias)
    g0 = jax.jit(jax.grad(lambda *a: 2.5 * plain(*a)[0], argnums))(h, w, bias)
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


def test_the_vocab_is_padded_on_accelerators_only():
    assert losses.vocab_pad_multiple("cpu") == 1 and losses.vocab_pad_multiple("gpu") == 128
    h, w, _, t, wt = _inputs(V=50)
    hlo = jax.jit(lambda h, w: losses.linear_cross_entropy(h, w, t, wt, vocab_multiple=16)).lower(h, w).as_text()
    assert "64x16" in hlo.replace(",", "x") and "50x16" in hlo.replace(",", "x")  # w padded from [50, 16]


def test_chunks_must_divide_the_length():
    h, w, _, t, wt = _inputs()
    with pytest.raises(ValueError, match="chunks=3 does not divide the length 8"):
        losses.linear_cross_entropy(h, w, t, wt, chunks=3)


def test_label_smoothing_matches_optax():
    logits = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 11))
    tgt = jax.random.randint(jax.random.PRNGKey(1), (2, 5), 0, 11)
    w = jnp.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], jnp.float32)
    ref = optax.softmax_cross_entropy(logits, optax.smooth_labels(jax.nn.one_hot(tgt, 11), 0.1))
    got = plain_losses.smoothed_cross_entropy(logits, tgt, w, 0.1)
    np.testing.assert_allclose(got, jnp.sum(ref * w), rtol=1e-5)
