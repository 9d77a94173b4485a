"""Position signals: sinusoids (Vaswani), T5's relative position buckets and their learned bias, and
rotary embeddings (RoPE, Llama's, with Llama 3's frequency scaling).

Learned absolute tables live with the families that own them (GPT's `wpe`, BERT's `position`, the
encoder-decoder's `Positions`), since their parameter names are checkpoint keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

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



@dataclass(frozen=True)
class Rope:
    """Rotary position embedding (Su et al.), as Llama applies it: each head's vector is split in two
    halves that rotate as (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) by angle position * inv_freq.
    `scaling` "llama3" stretches the low frequencies as Llama 3.1 does (factor, low/high frequency
    factors, the original context length); "none" keeps them. `head_dim` is the width rotated: a head wider
    than it (partial rotary, GPT-NeoX's rotary_pct) rotates its first `head_dim` dims and passes the rest."""

    head_dim: int
    theta: float = 10000.0
    scaling: str = "none"  # none | llama3 | linear (every frequency divided by factor: Gemma 3's global layers)
    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_len: int = 8192

    def inv_freq(self) -> np.ndarray:
        """[H/2] float32 angular frequencies, computed in float64 on the host as transformers does in float32."""
        inv = 1.0 / (self.theta ** (np.arange(0, self.head_dim, 2, dtype=np.int64).astype(np.float32) / self.head_dim))
        if self.scaling == "linear":
            inv = inv / self.factor
        if self.scaling == "llama3":
            low_wavelen = self.original_max_len / self.low_freq_factor
            high_wavelen = self.original_max_len / self.high_freq_factor
            wavelen = 2 * math.pi / inv
            scaled = np.where(wavelen > low_wavelen, inv / self.factor, inv)
            smooth = (self.original_max_len / wavelen - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
            mid = (1 - smooth) * scaled / self.factor + smooth * scaled
            medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
            inv = np.where(medium, mid, scaled)
        return inv.astype(np.float32)

    def __call__(self, x_BTNH, positions):
        """x rotated by its positions: `positions_T` shared by every row, or `positions_BT` per row (packed
        examples, whose positions restart at each example); the angles in float32, the result in x's dtype."""
        if x_BTNH.shape[-1] > self.head_dim:  # partial rotary: the dims past the rotated ones pass unchanged
            x_rot, x_pass = jnp.split(x_BTNH, [self.head_dim], axis=-1)
            return jnp.concatenate([self(x_rot, positions), x_pass], axis=-1)
        positions_BT = positions if positions.ndim == 2 else positions[None]
        angle_BTH2 = positions_BT.astype(jnp.float32)[..., None] * jnp.asarray(self.inv_freq())
        cos_BT1H, sin_BT1H = (jnp.concatenate([f(angle_BTH2)] * 2, -1)[:, :, None] for f in (jnp.cos, jnp.sin))
        x1, x2 = jnp.split(x_BTNH.astype(jnp.float32), 2, axis=-1)
        rotated = jnp.concatenate([-x2, x1], axis=-1)
        return (x_BTNH.astype(jnp.float32) * cos_BT1H + rotated * sin_BT1H).astype(x_BTNH.dtype)
