"""Reading a run for use: its config and its params, one path for every reader (zoo.load, `--init-from`, the
frozen half of a resumed LoRA run, zoo-eval, zoo-convert, zoo-sample).

    load_weights(run)                   (step, config, params) of the newest step that restores and verifies
      checkpoint.restore_config           that step's own config (never another step's)
      load_params_of(run, config)         its params as the plain model takes them:
        load_trained                        what the step holds (a LoRA run: its adapters and any new head)
        + load_weights(base, base step)     the frozen rest, read the same way from its init_from run at the
                                            step it trained on (base.json), recursively
        lora.merge                          the adapters merged into their kernels

Every step tried is verified against its checksums (zoo.training.checkpoint); one that does not restore is
reported in one line and the next older one is tried. `load_run` adds the task's model and the tokenizer.
Writing is zoo.training.checkpoint's (`save`, `save_weights`); resuming a whole train state is its
`restore_latest`.
"""

from __future__ import annotations

import contextlib
import json
import os

import flax.linen as nn
import jax
import orbax.checkpoint as ocp

from zoo import tasks
from zoo.configuration import Config
from zoo.data.tokenizers import get_tokenizer
from zoo.errors import CheckpointError
from zoo.models import FAMILIES
from zoo.nn import lora
from zoo.training import checkpoint, freeze
from zoo.training.checkpoint import all_steps, first_restorable, manager, portable, step_dir

BASE_FILE = "base.json"  # beside a run that trained part of its model: the init_from run and step it froze


def load_weights(workdir: str, sharding=None, step: int | None = None):
    """(step, config, params as load_params_of gives them) of the given step, or of the newest step whose
    config and params both restore and verify: a reader never takes one step's params under another step's
    config (a resumed run's steps may hold different configs)."""
    def load(s):
        cfg = checkpoint.restore_config(workdir, s)
        return cfg, load_params_of(workdir, cfg, sharding, s)
    with checkpoint._reading_alone() if sharding is None else contextlib.nullcontext():  # onto this process's device
        if step is not None:
            return (step, *load(step))
        step, (cfg, params) = first_restorable(workdir, load)
    return step, cfg, params


def load_params_of(workdir: str, cfg: Config, sharding=None, step: int | None = None):
    """The params of run `workdir` (config `cfg`) laid out with `sharding` (default: this process's first device), as
    its plain model takes them: a run that trained only part of its model (LoRA, train.trainable) is joined with
    the frozen rest from its init_from run (the step it trained on, base.json), and LoRA adapters are merged
    into their kernels."""
    trained, trainable = load_trained(workdir, cfg, sharding, step)
    if trainable is not None:
        abstract = freeze.flat(freeze.split(nn.unbox(jax.eval_shape(tasks.build(cfg).init, jax.random.PRNGKey(0))),
                                            trainable)[1])
        base = base_weights(workdir, cfg, abstract, sharding)[2]
        trained = freeze.join(trained, freeze.unflat({k: base[k] for k in abstract}))
    return lora.merge(trained, cfg.model.lora_spec)


def load_trained(workdir: str, cfg: Config, sharding=None, step: int | None = None):
    """(the params a run's checkpoint holds: what trained, the paths that trained (None: all)), laid out
    with `sharding` (default: this process's first device). A LoRA run's are its adapters (and any new head)."""
    sharding = sharding or jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    if freeze.partial(cfg) and cfg.init_from:
        check_base(workdir, cfg)  # a base gone or changed is said once, not as damage of every adapter step
    task = tasks.build(cfg)
    boxed = jax.eval_shape(task.init, jax.random.PRNGKey(0))
    trainable = trainable_of(cfg, boxed, getattr(task, "seen", ()))
    abstract = freeze.split(nn.unbox(boxed), trainable)[0]
    return load_params(workdir, jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding),
                                             abstract), step), trainable


def trainable_of(cfg: Config, boxed, seen=(), abstract_base: bool = False):
    """zoo.training.freeze.trainable_paths of `cfg` (boxed abstract params `boxed`), its init_from run's shapes read."""
    return freeze.trainable_paths(cfg, boxed, seen, base_of(cfg, lr=False), abstract_base)


def base_of(cfg: Config, *, lr: bool = True) -> dict | None:
    """path -> shape of the params of the run `cfg` trains on (init_from; a LoRA run's merged: its plain model's),
    read once for all that asks: which params a LoRA or partial run freezes (zoo.training.freeze.trainable_paths),
    and, with `lr`, which are new to the base and take optim.head_lr_mult. None where nothing asks (no init_from)."""
    if not cfg.init_from or not (freeze.partial(cfg) or lr and cfg.optim.head_lr_mult != 1):
        return None
    try:
        base_cfg = load_config(cfg.init_from)
    except CheckpointError as e:
        raise BaseError(f"the base this run trains on, init_from={cfg.init_from!r}, is missing or does not "
                        f"restore: {str(e).split('; train first')[0]}") from None
    return freeze.base_shapes(base_cfg)


def load_config(workdir: str, step: int | None = None) -> Config:
    """The config of the given step, or of the newest step whose config restores."""
    if step is not None:
        return checkpoint.restore_config(workdir, step)
    return first_restorable(workdir, lambda s: checkpoint.restore_config(workdir, s))[1]


def load_params(workdir: str, abstract_params=None, step: int | None = None):
    """The verified params of the given step, or of the newest step whose params restore and verify;
    laid out as `abstract_params` if given."""
    if step is not None:
        return _restore_params(workdir, step, abstract_params)
    return first_restorable(workdir, lambda s: _restore_params(workdir, s, abstract_params))[1]


def _restore_params(workdir: str, step: int, abstract_params):
    if abstract_params is None:
        try:
            abstract_params = _on_one_device(workdir, step)
        except Exception:  # damaged or missing: Orbax's own restore below says what is wrong with it
            pass
    with manager(workdir, read_only=True) as m:
        params = m.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore(abstract_params)))["params"]
    checkpoint._verify(workdir, step, "params", params)
    return params


def _on_one_device(workdir: str, step: int):
    """The saved params' shapes and dtypes, laid out on this process's first device: a reader without a layout
    of its own (sampling, conversion) reads a checkpoint whatever topology wrote it (2 processes x 4 devices,
    an 8-device mesh), where Orbax's default, the saved sharding, would refuse it."""
    with checkpoint._absl_errors_only():  # "Metadata file does not exist" for an item of a composite step: noise
        meta = ocp.StandardCheckpointer(**checkpoint._alone()).metadata(
            os.path.join(step_dir(workdir, step), "params")).item_metadata
    one = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=one), meta,
                        is_leaf=lambda m: hasattr(m, "shape") and hasattr(m, "dtype"))


def write_base(workdir: str, init_from: str, step: int) -> None:
    """base.json: the init_from run and step whose params a partly trained run keeps frozen, and that step's
    checksums' digest (a base replaced by another model is told apart by it)."""
    with open(os.path.join(workdir, BASE_FILE), "w") as f:
        json.dump({"init_from": portable({"init_from": init_from}, workdir)["init_from"], "step": int(step),
                   "checksums": _digest_of(init_from, step)}, f)


def _digest_of(run: str, step: int) -> str | None:
    """A hash of the params checksums saved with `step` of `run` (None for a step saved without them)."""
    import hashlib
    try:
        with open(os.path.join(step_dir(run, step), "digest", "metadata")) as f:
            saved = json.load(f)["params"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return hashlib.sha256(json.dumps(saved, sort_keys=True).encode()).hexdigest()[:16]


class BaseError(CheckpointError):
    """The base a partly trained run (LoRA, train.trainable) froze is missing, damaged or another model: said once,
    with no adapter step blamed (zoo.training.checkpoint.first_restorable passes it on)."""


def base_weights(workdir: str, cfg: Config, frozen: dict | None = None, sharding=None):
    """(step, config, flat params) of the base run `workdir` trained on, checked: base.json reads, its run still
    holds that step, the step is the one trained on (its checksums' digest) and restores, and holds every frozen
    param (`frozen`: path -> abstract array) at its shape. Raises BaseError naming which check failed and where."""
    src, about = cfg.init_from, f"the base that {workdir!r} trained on"
    step = check_base(workdir, cfg)
    try:
        step, base_cfg, params = load_weights(src, sharding, step)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as e:  # noqa: BLE001 - a damaged base is the base's fault, said once
        raise BaseError(f"{about}, {f'step {step} of ' if step is not None else ''}{src!r}, does not restore: "
                        f"{checkpoint._reason(e)}") from None
    params = freeze.flat(params)
    for k, a in (frozen or {}).items():
        if k not in params or params[k].shape != a.shape:
            got = params[k].shape if k in params else "absent"
            raise BaseError(f"{about}, {src!r}, is another model now: its param {k} is {got}, the run froze "
                            f"{a.shape}")
    return step, base_cfg, params


def check_base(workdir: str, cfg: Config) -> int | None:
    """The step of the base run `workdir` trained on (base.json), checked without reading its weights: base.json
    reads, the base run still holds that step, and the step is the one trained on (its checksums' digest)."""
    src, path = cfg.init_from, os.path.join(workdir, BASE_FILE)
    about = f"the base that {workdir!r} trained on"
    try:
        step = base_step(workdir, src)
    except CheckpointError as e:
        raise BaseError(f"{about} is missing: {e}") from None
    except (ValueError, KeyError, TypeError, OSError) as e:
        raise BaseError(f"{path} is damaged ({type(e).__name__}: {str(e).splitlines()[0][:120]}): it names {about} "
                        f"(init_from={src!r} and its step)") from None
    recorded = _recorded_digest(path)
    if recorded and step is not None and _digest_of(src, step) != recorded:
        raise BaseError(f"{about}, step {step} of {src!r}, has changed since (its checksums differ from those in "
                        f"{path}): the adapters only fit the weights they were trained on")
    return step


def _recorded_digest(path: str) -> str | None:
    try:
        with open(path) as f:
            return json.load(f).get("checksums")
    except (OSError, ValueError, AttributeError):
        return None


def base_step(workdir: str, init_from: str) -> int | None:
    """The step of `init_from` a partly trained run froze (base.json), or None (a run from before it)."""
    path = os.path.join(workdir, BASE_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        step = json.load(f)["step"]
    if step not in all_steps(init_from):
        raise CheckpointError(f"{workdir!r} trained on step {step} of its base, init_from={init_from!r}, which no "
                              f"longer holds it (steps: {', '.join(map(str, all_steps(init_from))) or 'none'})")
    return step


def load_run(workdir: str, task: str | None = None):
    """(model, params, tokenizer, config) of a run's latest checkpoint, params on one device (the plain model
    and merged params of a LoRA run); with `task`, the run must be of that task (or, given a family name,
    of that family)."""
    _, cfg, params = load_weights(workdir)
    if task in FAMILIES and cfg.model.family != task:
        raise CheckpointError(f"{workdir!r} holds a {cfg.model.family} model; this command needs a run of family {task}")
    if task is not None and task not in FAMILIES and cfg.task != task:
        raise CheckpointError(f"{workdir!r} holds a {cfg.task} run; this command needs a {task} run")
    return tasks.build(cfg).model, params, get_tokenizer(cfg.data.tokenizer), cfg
