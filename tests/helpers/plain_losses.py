"""Cross-entropy over materialised [B, T, V] logits: the reference zoo.losses' fused loss is tested against."""

import jax
import jax.numpy as jnp
import optax


def token_cross_entropy(logits_BTV, targets_BT, weights_BT):
    """Sum of weighted token cross-entropies and of correct argmax predictions (float32)."""
    ce_BT = optax.softmax_cross_entropy_with_integer_labels(logits_BTV.astype(jnp.float32), targets_BT)
    correct_BT = (jnp.argmax(logits_BTV, -1) == targets_BT).astype(jnp.float32)
    return jnp.sum(ce_BT * weights_BT), jnp.sum(correct_BT * weights_BT)


def smoothed_cross_entropy(logits_BTV, targets_BT, weights_BT, smoothing: float):
    """Weighted sum of cross-entropies against (1 - s) * one-hot + s * uniform over V (no [B, T, V] one-hot)."""
    logp_BTV = jax.nn.log_softmax(logits_BTV.astype(jnp.float32))
    nll_BT = -jnp.take_along_axis(logp_BTV, targets_BT[..., None], -1)[..., 0]
    return jnp.sum(((1 - smoothing) * nll_BT - smoothing * jnp.mean(logp_BTV, -1)) * weights_BT)
