"""Position signals: sinusoids (Vaswani), and T5's relative position buckets and their learned bias.

Learned absolute tables live with the families that own them (GPT's `wpe`, BERT's `position`, the
encoder-decoder's `Positions`), since their parameter names are checkpoint keys.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax.numpy as jnp

from zoo.nn.layers import Dtype, normal


def sinusoidal_positions(positions_T, features: int):
    """pos_TD (float32), Vaswani et al.: sin(p / 10000^(2i/D)) on the first half of D, cos on the second."""
    inv_freq = jnp.exp(-math.log(10000.0) * jnp.arange(0, features, 2) / features)  # [D/2]
    angle = positions_T.astype(jnp.float32)[:, None] * inv_freq[None]  # [T, D/2]
    return jnp.concatenate([jnp.sin(angle), jnp.cos(angle)], axis=-1)


def relative_position_bucket(relative_TS, bidirectional: bool, num_buckets: int, max_distance: int):
    """T5's bucket of each (key - query) offset: one bucket per offset below num_buckets / 2 (per
    direction), then log-spaced buckets up to max_distance, the last one holding everything beyond."""
    bucket_TS = jnp.zeros_like(relative_TS)
    if bidirectional:
        num_buckets //= 2
        bucket_TS = bucket_TS + (relative_TS > 0) * num_buckets
        n_TS = jnp.abs(relative_TS)
    else:  # the decoder only sees keys at or before the query
        n_TS = jnp.maximum(-relative_TS, 0)
    exact = num_buckets // 2
    # max(n, 1): log(0) is -inf; those offsets take the exact branch anyway.
    log_ratio_TS = jnp.log(jnp.maximum(n_TS, 1) / exact) / math.log(max_distance / exact)
    large_TS = jnp.minimum(exact + (log_ratio_TS * (num_buckets - exact)).astype(jnp.int32), num_buckets - 1)
    return bucket_TS + jnp.where(n_TS < exact, n_TS, large_TS)


class RelativePositionBias(nn.Module):
    """T5 relative attention bias: a learned scalar per (offset bucket, head), shared by all layers."""

    num_heads: int
    num_buckets: int = 32
    max_distance: int = 128
    bidirectional: bool = True
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, q_positions_T, k_positions_S):
        table = self.param("embedding", normal(0.02, (None, "heads")), (self.num_buckets, self.num_heads),
                           self.param_dtype)  # [buckets, N]
        bucket_TS = relative_position_bucket(k_positions_S[None, :] - q_positions_T[:, None], self.bidirectional,
                                             self.num_buckets, self.max_distance)
        bias_TSN = jnp.take(table, bucket_TS, axis=0).astype(jnp.float32)
        return jnp.moveaxis(bias_TSN, -1, 0)[None]  # bias_1NTS

