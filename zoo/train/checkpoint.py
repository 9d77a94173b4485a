"""Orbax CheckpointManager wrapper: save / restore / resume, and the one loader of a run's weights.

Layout: WORKDIR/checkpoints/<step>/{params, train, config}. `params` is stored as its own item so
sampling, fine-tuning (`init_from`) and conversion read only the weights. Orbax writes each step
into a temporary directory and renames it when complete, so an interrupted save never replaces a
good checkpoint; saves are asynchronous and `close()` waits for the last one.
"""

from __future__ import annotations

import os

import flax.linen as nn
import jax
import orbax.checkpoint as ocp

from zoo import tasks
from zoo.config import Config, from_dict
from zoo.data.tokenizers import get_tokenizer
from zoo.errors import CheckpointError
from zoo.models import FAMILIES


def ckpt_dir(workdir: str) -> str:
    return os.path.join(os.path.abspath(os.path.expanduser(workdir)), "checkpoints")


def manager(workdir: str, keep: int = 3, async_save: bool = True, read_only: bool = False):
    # Readers open the manager with create=False and never save; orbax's read_only mode only logs noise.
    options = ocp.CheckpointManagerOptions(max_to_keep=None if read_only else keep, create=not read_only,
                                           enable_async_checkpointing=async_save and not read_only)
    return ocp.CheckpointManager(ckpt_dir(workdir), options=options,
                                 item_names=("params", "train", "config"))


def latest_step(workdir: str) -> int | None:
    if not os.path.isdir(ckpt_dir(workdir)):
        return None
    with manager(workdir, read_only=True) as m:
        return m.latest_step()


def require_latest(workdir: str) -> int:
    step = latest_step(workdir)
    if step is None:
        raise CheckpointError(f"no checkpoint in {workdir!r} (looked for {ckpt_dir(workdir)}/<step>); "
                              f"train first: python train.py CONFIG --workdir {workdir}")
    return step


def save(mngr, state, cfg: Config, force: bool = False) -> None:
    step = int(jax.device_get(state.step))
    mngr.save(step, force=force, args=ocp.args.Composite(
        params=ocp.args.StandardSave(state.params),
        train=ocp.args.StandardSave({"step": state.step, "opt_state": state.opt_state, "rng": state.rng}),
        config=ocp.args.JsonSave(cfg.to_dict())))


def restore(mngr, step: int, abstract_state):
    """Restore the whole TrainState; `abstract_state` holds ShapeDtypeStructs with shardings."""
    a = abstract_state
    out = mngr.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(a.params),
        train=ocp.args.StandardRestore({"step": a.step, "opt_state": a.opt_state, "rng": a.rng})))
    t = out["train"]
    return a.replace(step=t["step"], params=out["params"], opt_state=t["opt_state"], rng=t["rng"])


def load_config(workdir: str, step: int | None = None) -> Config:
    step = require_latest(workdir) if step is None else step
    with manager(workdir, read_only=True) as m:
        d = m.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))["config"]
    return from_dict(d)


def load_params(workdir: str, abstract_params=None, step: int | None = None):
    """The params of a run's latest (or given) checkpoint; laid out as `abstract_params` if given."""
    step = require_latest(workdir) if step is None else step
    with manager(workdir, read_only=True) as m:
        args = ocp.args.StandardRestore(abstract_params) if abstract_params is not None else \
            ocp.args.StandardRestore()
        return m.restore(step, args=ocp.args.Composite(params=args))["params"]


def save_weights(workdir: str, params, cfg: Config, step: int = 0) -> None:
    """A weights-only checkpoint (converted models): `params` and `config`, no optimizer state.
    Sampling, `init_from` and `to-hf` read it; `--resume` does not apply."""
    with manager(workdir, async_save=False) as m:
        m.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(params),
                                             config=ocp.args.JsonSave(cfg.to_dict())))


def has_train_state(workdir: str, step: int) -> bool:
    return os.path.isdir(os.path.join(ckpt_dir(workdir), str(step), "train"))


def load_params_of(workdir: str, cfg: Config, sharding=None, step: int | None = None):
    """The params of run `workdir` (config `cfg`) laid out with `sharding` (default: the first device)."""
    sharding = sharding or jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = nn.unbox(jax.eval_shape(tasks.build(cfg).init, jax.random.PRNGKey(0)))
    return load_params(workdir, jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding),
                                             abstract), step)


def load_run(workdir: str, task: str | None = None):
    """(model, params, tokenizer, config) of a run's latest checkpoint, params on one device; with `task`,
    the run must be of that task (or, given a family name, of that family)."""
    cfg = load_config(workdir)
    if task in FAMILIES and cfg.model.family != task:
        raise CheckpointError(f"{workdir!r} holds a {cfg.model.family} model; this command needs a run of family {task}")
    if task is not None and task not in FAMILIES and cfg.task != task:
        raise CheckpointError(f"{workdir!r} holds a {cfg.task} run; this command needs a {task} run")
    return tasks.build(cfg).model, load_params_of(workdir, cfg), get_tokenizer(cfg.data.tokenizer), cfg
