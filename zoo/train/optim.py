"""Optax chains and the warmup-schedule registry.

Every schedule maps the optimizer step k (0-based count of updates already applied, as optax passes
it) to a learning rate; they are composed from optax's own (warmup_cosine_decay_schedule,
join_schedules of linear and constant pieces) except Noam's formula. Warmup is linear from 0; its
length is resolved once by `OptimConfig.warmup_steps`. Weight decay applies only to matrices (rank >= 2 once a scanned
`layers` axis is discounted): biases, norms' scales and offsets are never decayed.
"""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from zoo.config import OptimConfig
from zoo.errors import ConfigError


def _warmup(cfg: OptimConfig, W: int):
    return optax.linear_schedule(0.0, cfg.lr, W)  # lr * k / W for k < W


def cosine(cfg: OptimConfig, total: int, W: int, d_model: int) -> Callable:
    """Linear warmup, then cosine decay to lr * min_lr_ratio at the last step."""
    return optax.warmup_cosine_decay_schedule(0.0, cfg.lr, W, W + max(total - W, 1), end_value=cfg.lr * cfg.min_lr_ratio)


def linear(cfg: OptimConfig, total: int, W: int, d_model: int) -> Callable:
    """BERT: linear warmup, then linear decay to 0 at the last step."""
    return optax.join_schedules([_warmup(cfg, W), optax.linear_schedule(cfg.lr, 0.0, max(total - W, 1))], [W])


def constant(cfg: OptimConfig, total: int, W: int, d_model: int) -> Callable:
    return optax.join_schedules([_warmup(cfg, W), optax.constant_schedule(cfg.lr)], [W])


def wsd(cfg: OptimConfig, total: int, W: int, d_model: int) -> Callable:
    """Warmup-stable-decay: flat at lr, then linear to lr * min_lr_ratio over the last decay_fraction (which
    starts after the warmup at the earliest)."""
    start = max(total - max(int(round(cfg.decay_fraction * total)), 1), W)
    decay = optax.linear_schedule(cfg.lr, cfg.lr * cfg.min_lr_ratio, max(total - start, 1))
    return optax.join_schedules([_warmup(cfg, W), optax.constant_schedule(cfg.lr), decay], [W, start])


def noam(cfg: OptimConfig, total: int, W: int, d_model: int) -> Callable:
    """Vaswani et al.: lr * d_model^-0.5 * min(step^-0.5, step * W^-1.5), with step = k + 1 (no optax form)."""
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


def warmup_warning(cfg: OptimConfig, total_steps: int) -> str | None:
    """The warning a run gets (once, as it starts training) when its warmup is longer than the run."""
    warmup = cfg.warmup_steps(total_steps)
    if warmup > total_steps > 0 and cfg.schedule != "noam":
        return (f"warning: optim.warmup={cfg.warmup:g} is {warmup} steps, more than train.steps={total_steps}: the "
                f"learning rate never reaches optim.lr={cfg.lr:g}; set optim.warmup to a fraction (e.g. 0.05) or fewer "
                f"steps")
    return None


def decay_mask(boxed_params):
    """True for params that get weight decay: rank >= 2, not counting a scanned `layers` axis."""
    def rank(p):
        if isinstance(p, nn.Partitioned):
            return sum(n != "layers" for n in p.names)
        return p.ndim
    return jax.tree.map(lambda p: rank(p) >= 2, boxed_params,
                        is_leaf=lambda p: isinstance(p, nn.Partitioned))


def make_optimizer(cfg: OptimConfig, schedule: Callable, mask, new=None) -> optax.GradientTransformation:
    """AdamW (decay on `mask`), after global-norm clipping; the updates of `new` (a tree of bools like the params:
    params the fine-tune's checkpoint lacks) scaled by optim.head_lr_mult, when it is not 1 and some are new."""
    adamw = optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay, mask=mask)
    parts = [optax.clip_by_global_norm(cfg.clip_norm)] if cfg.clip_norm > 0 else []
    parts.append(adamw)
    if cfg.head_lr_mult != 1 and new is not None and any(jax.tree.leaves(new)):
        parts.append(optax.masked(optax.scale(cfg.head_lr_mult), new))
    return optax.chain(*parts) if len(parts) > 1 else adamw


def new_mask(boxed_params, base_shapes: dict):
    """True for params whose path (or shape) the init_from run's params lack: what a fine-tune starts fresh."""
    from zoo.train import freeze
    flat = {k: tuple(v.shape) for k, v in freeze.flat(nn.unbox(boxed_params)).items()}
    return freeze.unflat({k: base_shapes.get(k) != s for k, s in flat.items()})
