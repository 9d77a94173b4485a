"""Optax chains and the warmup-schedule registry.

Every schedule maps the optimizer step k (0-based count of updates already applied, as optax passes
it) to a learning rate. Warmup is linear from 0; its length is resolved once by
`OptimConfig.warmup_steps`. Weight decay applies only to matrices (rank >= 2 once a scanned
`layers` axis is discounted): biases, norms' scales and offsets are never decayed.
"""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from zoo.config import ConfigError, OptimConfig


def _warm(lr, k, W):
    return lr * k / max(W, 1)


def cosine(cfg: OptimConfig, total: int, W: int, d_model: int) -> Callable:
    def f(k):
        k = jnp.asarray(k, jnp.float32)
        progress = jnp.clip((k - W) / max(total - W, 1), 0.0, 1.0)
        decay = cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + jnp.cos(jnp.pi * progress))
        return jnp.where(k < W, _warm(cfg.lr, k, W), cfg.lr * decay)
    return f


def linear(cfg: OptimConfig, total: int, W: int, d_model: int) -> Callable:
    """BERT: linear warmup, then linear decay to 0 at the last step."""
    def f(k):
        k = jnp.asarray(k, jnp.float32)
        progress = jnp.clip((k - W) / max(total - W, 1), 0.0, 1.0)
        return jnp.where(k < W, _warm(cfg.lr, k, W), cfg.lr * (1 - progress))
    return f


def constant(cfg: OptimConfig, total: int, W: int, d_model: int) -> Callable:
    def f(k):
        k = jnp.asarray(k, jnp.float32)
        return jnp.where(k < W, _warm(cfg.lr, k, W), cfg.lr)
    return f


def wsd(cfg: OptimConfig, total: int, W: int, d_model: int) -> Callable:
    """Warmup-stable-decay: flat at lr, then linear to lr * min_lr_ratio over the last decay_fraction."""
    decay_steps = max(int(round(cfg.decay_fraction * total)), 1)
    start = total - decay_steps

    def f(k):
        k = jnp.asarray(k, jnp.float32)
        progress = jnp.clip((k - start) / decay_steps, 0.0, 1.0)
        stable = cfg.lr * (1 - (1 - cfg.min_lr_ratio) * progress)
        return jnp.where(k < W, _warm(cfg.lr, k, W), stable)
    return f


def noam(cfg: OptimConfig, total: int, W: int, d_model: int) -> Callable:
    """Vaswani et al.: lr * d_model^-0.5 * min(step^-0.5, step * W^-1.5), with step = k + 1."""
    if W < 1:
        raise ConfigError("optim.schedule='noam' needs optim.warmup >= 1 step (the formula divides by it)")

    def f(k):
        step = jnp.asarray(k, jnp.float32) + 1.0
        return cfg.lr * d_model ** -0.5 * jnp.minimum(step ** -0.5, step * W ** -1.5)
    return f


SCHEDULES: dict[str, Callable] = {"cosine": cosine, "linear": linear, "constant": constant, "wsd": wsd,
                                  "noam": noam}


def make_schedule(cfg: OptimConfig, total_steps: int, d_model: int) -> Callable:
    return SCHEDULES[cfg.schedule](cfg, total_steps, cfg.warmup_steps(total_steps), d_model)


def decay_mask(boxed_params):
    """True for params that get weight decay: rank >= 2, not counting a scanned `layers` axis."""
    def rank(p):
        if isinstance(p, nn.Partitioned):
            return sum(n != "layers" for n in p.names)
        return p.ndim
    return jax.tree.map(lambda p: rank(p) >= 2, boxed_params,
                        is_leaf=lambda p: isinstance(p, nn.Partitioned))


def make_optimizer(cfg: OptimConfig, schedule: Callable, mask) -> optax.GradientTransformation:
    adamw = optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay, mask=mask)
    if cfg.clip_norm > 0:
        return optax.chain(optax.clip_by_global_norm(cfg.clip_norm), adamw)
    return adamw
