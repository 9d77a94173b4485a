"""Optax chains and the warmup-schedule registry.

Every schedule maps the optimizer step k (0-based count of updates already applied, as optax passes
it) to a learning rate; they are composed from optax's own (warmup_cosine_decay_schedule,
join_schedules of linear and constant pieces) except Noam's formula. Warmup is linear from 0; its
length is resolved once by `OptimConfig.warmup_steps`. Weight decay applies only to matrices (rank >= 2 once a scanned
`layers` axis is discounted): biases, norms' scales and offsets are never decayed.

optim.name=muon (`muon`): Muon (momentum orthogonalised by Newton-Schulz, optax.contrib's pieces) on the hidden
kernels, each seen as one matrix [inputs, outputs] named by its logical axes (`muon_dims`), and the same AdamW as
above on the rest: embeddings, the output head, norms, biases.
"""

from __future__ import annotations

import math
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from optax.contrib import MuonDimensionNumbers, scale_by_muon

from zoo.configuration import OptimConfig
from zoo.errors import ConfigError
from zoo.nn import lora


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


def make_optimizer(cfg: OptimConfig, schedule: Callable, mask, new=None, boxed=None) -> optax.GradientTransformation:
    """AdamW (decay on `mask`), or with optim.name=muon Muon on the kernels of `boxed` (the boxed params: their
    logical names pick the leaves and their matrices, `muon_dims`) and AdamW on the rest, after global-norm clipping;
    the updates of `new` (a tree of bools like the params: params the fine-tune's checkpoint lacks) scaled by
    optim.head_lr_mult, when it is not 1 and some are new."""
    adamw = optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay, mask=mask)
    if cfg.name == "muon":
        if boxed is None:
            raise ValueError("make_optimizer: optim.name='muon' needs the boxed params (boxed=) for muon_dims")
        adamw = muon(cfg, schedule, mask, muon_dims(boxed))
    parts = [optax.clip_by_global_norm(cfg.clip_norm)] if cfg.clip_norm > 0 else []
    parts.append(adamw)
    if cfg.head_lr_mult != 1 and new is not None and any(jax.tree.leaves(new)):
        parts.append(optax.masked(optax.scale(cfg.head_lr_mult), new))
    return optax.chain(*parts) if len(parts) > 1 else adamw


# Muon's coefficients, Keller Jordan's (modded-nanogpt, optax's default): 5 steps take the normalised momentum's
# singular values into about [0.7, 1.2] rather than exactly 1, which trains as well and converges faster.
NS_COEFFS = (3.4445, -4.775, 2.0315)
# The axes Muon may see as rows or columns of a kernel's matrix, and those it treats as a batch of matrices (a
# scanned `layers` axis, MoE experts): each layer's (expert's) matrix is orthogonalised on its own.
MATRIX_AXES = ("embed", "mlp", "heads", "kv")
BATCH_AXES = ("layers", "expert")


def _is_dims(x) -> bool:
    return x is None or isinstance(x, MuonDimensionNumbers)


def kernel_dims(names) -> MuonDimensionNumbers | None:
    """The matrix Muon orthogonalises for a leaf with logical axes `names`, or None (AdamW): the `embed` axis is
    one side, every other hidden axis the other (q/k/v [D, N, H] -> [D, N*H], out [N, H, D] -> [N*H, D], MLP [D, F]
    and [F, D]), the input side first as the kernel's einsum reads it. None for what is not a hidden kernel: a
    vocab axis (embeddings, the untied head), an unnamed axis (position tables, classifier heads, LoRA's rank
    axis), or fewer than two matrix axes (norms, biases, a router [D, E])."""
    rest = [i for i, n in enumerate(names) if n not in BATCH_AXES]
    if "embed" not in names or len(rest) < 2 or any(names[i] not in MATRIX_AXES for i in rest):
        return None
    e = names.index("embed")
    others = tuple(i for i in rest if i != e)
    if e == rest[0]:
        return MuonDimensionNumbers(reduction_axis=(e,), output_axis=others)
    return MuonDimensionNumbers(reduction_axis=others, output_axis=(e,))


def muon_dims(boxed_params):
    """`kernel_dims` of every leaf of the boxed params (a leaf without names: None, AdamW). LoRA adapters are
    refused: their rank-r factors are not the kernels Muon's scaling assumes, and Muon on A and B apart is not
    Muon on the update A B."""
    is_box = lambda p: isinstance(p, nn.Partitioned)  # noqa: E731
    paths = jax.tree_util.tree_flatten_with_path(boxed_params, is_leaf=is_box)[0]
    if any(getattr(k[-1], "key", None) in lora.LEAVES for k, _ in paths):
        raise ConfigError("optim.name='muon' does not train LoRA adapters (model.lora_rank > 0); use "
                          "optim.name=adamw for a LoRA run")
    return jax.tree.map(lambda p: kernel_dims(p.names) if is_box(p) else None, boxed_params, is_leaf=is_box)


def scale_by_shape(dims, rms: float) -> optax.GradientTransformation:
    """Moonlight's consistent RMS (optax.contrib.muon's consistent_rms): an orthogonalised [m, n] update has RMS
    about 1/sqrt(max(m, n)); times sqrt(max(fan_in, fan_out)) * rms its RMS is `rms`, whatever the shape."""
    def scale(u, d):
        fan_in = math.prod(u.shape[a] for a in d.reduction_axis)
        fan_out = math.prod(u.shape[a] for a in d.output_axis)
        return u * (math.sqrt(max(fan_in, fan_out)) * rms)

    def update(updates, state, params=None):
        return jax.tree.map(scale, updates, dims, is_leaf=_is_dims), state
    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def muon(cfg: OptimConfig, schedule: Callable, mask, dims) -> optax.GradientTransformation:
    """Muon on the leaves whose `dims` is not None, AdamW (decay on `mask`) on the others, as optax.contrib.muon
    composes it (Nesterov momentum, Newton-Schulz, shape scaling, decoupled decay, learning rate) but with zoo's
    AdamW on the rest: optax's own decays every AdamW leaf (norms too) and uses Nesterov there.

    The rate: Moonlight's convention (optax's consistent_rms, optim.muon_rms=0.2), not modded-nanogpt's
    sqrt(max(1, fan_out / fan_in)) at lr 0.02-0.05 beside a separate Adam rate (0.008 for its embeddings). Scaled
    to AdamW's typical update RMS, a Muon leaf takes optim.lr, the schedule and optim.weight_decay (times lr, as
    AdamW's) as the AdamW leaves do: one rate serves both, and an AdamW run's settings carry over."""
    labels = jax.tree.map(lambda d: "adamw" if d is None else "muon", dims, is_leaf=_is_dims)
    on_muon = jax.tree.map(lambda d: optax.MaskedNode() if d is None else d, dims, is_leaf=_is_dims)
    on_adamw = jax.tree.map(lambda m, d: m if d is None else optax.MaskedNode(), mask, dims, is_leaf=_is_dims)
    matrices = optax.chain(
        scale_by_muon(NS_COEFFS, cfg.muon_ns_steps, cfg.muon_beta, cfg.eps, nesterov=True,
                      weight_dimension_numbers=on_muon),
        scale_by_shape(on_muon, cfg.muon_rms),
        optax.add_decayed_weights(cfg.weight_decay),  # every Muon leaf is a matrix: all decay
        optax.scale_by_learning_rate(schedule))
    adamw = optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay, mask=on_adamw)
    return optax.partition({"muon": matrices, "adamw": adamw}, labels)


def new_mask(boxed_params, base_shapes: dict | None):
    """True for params whose path (or shape) the init_from run's params (`base_shapes`: path -> shape, as
    zoo.training.runs.base_of reads them) lack: what a fine-tune starts fresh. None without a base."""
    if base_shapes is None:
        return None
    from zoo.training import freeze
    flat = {k: tuple(v.shape) for k, v in freeze.flat(nn.unbox(boxed_params)).items()}
    return freeze.unflat({k: base_shapes.get(k) != s for k, s in flat.items()})
