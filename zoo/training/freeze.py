"""Which parameters train and which stay frozen, and the two halves of a param tree.

A run trains every parameter unless its config says otherwise: with LoRA adapters (model.lora_rank) only
the adapters train, with `train.trainable` (a regex over "/"-joined param paths, e.g. "h_11/|ln_f") only
the matches, and in both cases any parameter the init_from run lacks (a new head) too. The trainer keeps
the two halves apart: `TrainState.params` holds what trains (gradients and optimizer moments exist for it
alone, and checkpoints store it alone), `TrainState.frozen` the rest, read back from the init_from run.
With model.quantize_base the frozen kernels of adapted layers are held quantized (zoo.nn.quant).

Paths are "/"-joined keys of the param dict ("h_0/attn/query/kernel"); a tree splits into two nested
dicts holding disjoint leaves, and `join` unions them back.
"""

from __future__ import annotations

import re

import flax.linen as nn
import jax
from flax import traverse_util

from zoo.errors import ConfigError
from zoo.nn import lora, quant


def flat(tree) -> dict:
    return traverse_util.flatten_dict(tree, sep="/") if tree else {}


def unflat(d: dict) -> dict:
    return traverse_util.unflatten_dict(d, sep="/") if d else {}


def split(tree, trainable) -> tuple[dict, dict]:
    """(the trainable leaves, the frozen ones) as two nested dicts; trainable None: everything trains."""
    if trainable is None:
        return tree, {}
    f = flat(tree)
    return unflat({k: v for k, v in f.items() if k in trainable}), unflat({k: v for k, v in f.items()
                                                                           if k not in trainable})


def join(train, frozen):
    """One tree from the two halves."""
    if not frozen:
        return train
    return unflat({**flat(train), **flat(frozen)})


def _shapes(tree) -> dict:
    return {k: tuple(v.shape) for k, v in flat(nn.unbox(tree)).items()}


def partial(cfg) -> bool:
    """Whether `cfg` trains only part of its model (LoRA adapters, or train.trainable)."""
    return bool(cfg.train.trainable) or cfg.model.lora_spec is not None


def base_shapes(base_cfg) -> dict:
    """path -> shape of the params a run of config `base_cfg` holds (a LoRA run's, merged: its plain model's)."""
    from zoo import tasks
    return _shapes(jax.eval_shape(tasks.plain(base_cfg).init, jax.random.PRNGKey(0)))


def trainable_paths(cfg, abstract, seen=(), base=None, abstract_base: bool = False) -> frozenset | None:
    """The paths that train (None: all) for `cfg`, whose model's boxed abstract params are `abstract`;
    `seen` are the Einsum layers the model called (named when lora_targets matches none); `base` is path -> shape
    of the init_from run's params (zoo.training.runs.base_of reads them), which the frozen part is.
    `abstract_base`: with no init_from, the model's own params stand for the base (a program compiled and never
    run: zoo.aot)."""
    pattern, adapters = cfg.train.trainable, cfg.model.lora_spec
    if not partial(cfg):
        return None
    what = "model.lora_rank" if adapters is not None else "train.trainable"
    if not cfg.init_from and not abstract_base:
        raise ConfigError(f"{what} freezes a base model, which comes from init_from: fine-tune a run with "
                          f"--init-from RUN (or --set init_from=RUN)")
    shapes = _shapes(abstract)
    chosen = {p for p in shapes if lora.is_adapter(p)}
    if adapters is not None and not chosen:
        names = sorted({path[-1] for path in seen} | {"/".join(path[-2:]) for path in seen})
        raise ConfigError(f"model.lora_targets={cfg.model.lora_targets!r} matches no layer of this model; "
                          f"layers: {', '.join(names)}")
    if pattern:
        matched = {p for p in shapes if re.search(pattern, p) and not lora.is_adapter(p)}
        if not matched:
            examples = ", ".join(list(shapes)[:3])
            raise ConfigError(f"train.trainable={pattern!r} matches no parameter; paths look like {examples}")
        chosen |= matched
    base = base if base is not None else shapes if abstract_base else {}
    chosen |= {p for p, s in shapes.items() if not lora.is_adapter(p) and base.get(p) != s}  # new: a fresh head
    if len(chosen) == len(shapes):
        return None
    return frozenset(chosen)


def quantize_frozen(frozen, train, kind: str, scanned: bool):
    """`frozen` with the kernel of every adapted layer (an adapter of it in `train`) held as a `qkernel` of
    `kind` (int8 | nf4; "none": as it is); `scanned`: the kernels lead with a layers axis. Boxed leaves stay
    boxed, the codes and scales named ([layers,] first input axis, first output axis)."""
    if kind == "none" or not frozen:
        return frozen
    f, t, lead = flat(frozen), flat(train), int(scanned)
    for path in [p for p in f if p.endswith("/kernel") and p[:-len("kernel")] + "lora_a" in t]:
        kernel, a = f.pop(path), nn.unbox(t[path[:-len("kernel")] + "lora_a"])
        n_in = a.ndim - 1 - lead
        q = quant.quantize(nn.unbox(kernel), n_in, kind, lead)
        for name, v in q.items():
            if isinstance(kernel, nn.Partitioned):
                names = kernel.names[:lead] + (kernel.names[lead], kernel.names[lead + n_in])
                v = nn.Partitioned(v, names=names, mesh=kernel.mesh)
            f[path[:-len("kernel")] + "qkernel/" + name] = v
    return unflat(f)


def flops_per_token(task, seq_len: int, abstract, trainable) -> float:
    """The task's training FLOPs per token (for MFU) when part of the model is frozen: a frozen matmul's weight
    gradient is never computed (2 of its 6 FLOPs per param), and the adapters, which the task's count of its
    plain model leaves out, cost 6 per param."""
    from zoo.tasks.base import count
    fpt = task.flops_per_token(seq_len)
    if trainable is None:
        return fpt
    train, frozen = split(abstract, trainable)
    adapters = unflat({k: v for k, v in flat(train).items() if lora.is_adapter(k)})
    return fpt - 2 * count(frozen, exclude=getattr(task, "EXCLUDE", ())) + 6 * count(adapters)
