"""The config saved beside each checkpoint step: written with its paths portable (run-relative inside the run),
read back located where the run is now (`restore_config`), and refused as damage of that step when it belongs to
another run or does not describe the step's own arrays. zoo.training.checkpoint saves and restores through it.
"""

from __future__ import annotations

import json
import os

import jax
import orbax.checkpoint as ocp

from zoo.configuration import Config, from_dict
from zoo.errors import CheckpointError
from zoo.training.checkpoint_manager import manager, step_dir


# Config fields that may name files. Saved beside a checkpoint, a path inside the run is written relative to
# it ("./base/tokenizer") and a relative path given from the working directory is made absolute, so a run
# directory can be moved or copied whole and read where it lands.
PATH_FIELDS = (("data", "tokenizer"), ("data", "chat_template"), (None, "init_from"))
HERE = "./"


def _paths(d: dict, fn) -> dict:
    d = {k: dict(v) if isinstance(v, dict) else v for k, v in d.items()}
    for section, key in PATH_FIELDS:
        holder = d.get(section) if section else d
        if isinstance(holder, dict) and isinstance(holder.get(key), str) and holder[key]:
            holder[key] = fn(holder[key])
    return d


def portable(d: dict, workdir: str) -> dict:
    """A config dict as saved in `workdir`: its paths relative to the run where they lie inside it."""
    root = os.path.abspath(os.path.expanduser(workdir))

    def rel(v: str) -> str:
        if v.startswith(HERE) or not os.path.exists(os.path.expanduser(v)):
            return v  # a name (bytes, gpt2), or already run-relative
        full = os.path.abspath(os.path.expanduser(v))
        return HERE + os.path.relpath(full, root) if os.path.commonpath([full, root]) == root else full
    return _paths(d, rel)


def located(d: dict, workdir: str) -> dict:
    """A saved config dict with its run-relative paths made absolute for where `workdir` is now."""
    root = os.path.abspath(os.path.expanduser(workdir))
    return _paths(d, lambda v: os.path.normpath(os.path.join(root, v[len(HERE):])) if v.startswith(HERE) else v)


def restore_config(workdir: str, step: int) -> Config:
    """The config saved with `step` (its paths located where the run is now)."""
    with manager(workdir, read_only=True) as m:
        d = m.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))["config"]
    cfg = from_dict(located(d, workdir))
    _same_run(workdir, cfg)
    _describes_its_arrays(workdir, step, cfg)
    return cfg


_DESCRIBED: set = set()  # step directories whose config was checked against their arrays (once a process)


def _describes_its_arrays(workdir: str, step: int, cfg: Config) -> None:
    """The step's saved params have the shapes its config's model builds: a config that does not describe its own
    arrays (edited, or from another run) is damage of that step alone, so readers fall back past it as past any.
    The shapes come from Orbax's metadata (no array is read)."""
    folder = os.path.join(step_dir(workdir, step), "params")
    key = (os.path.realpath(folder), _mtime(os.path.join(step_dir(workdir, step), "config")))
    if key in _DESCRIBED or not os.path.isdir(folder):
        return
    try:
        from etils import epath
        meta = ocp.StandardCheckpointHandler().metadata(epath.Path(folder))
    except Exception:  # noqa: BLE001 - the params' own damage is reported by their restore
        return
    saved = {jax.tree_util.keystr(p): tuple(a.shape) for p, a in
             jax.tree_util.tree_leaves_with_path(getattr(meta, "tree", meta)) if hasattr(a, "shape")}
    import flax.linen as nn
    from zoo import tasks
    built = {jax.tree_util.keystr(p): tuple(a.shape) for p, a in jax.tree_util.tree_leaves_with_path(
        nn.unbox(jax.eval_shape(tasks.build(cfg).init, jax.random.PRNGKey(0))))}
    wrong = [k for k in sorted(saved) if built.get(k) != saved[k]]
    if wrong:
        k = wrong[0]
        raise CheckpointError(f"its config does not describe its own arrays: params{k} is {saved[k]} there but "
                              f"{built[k] if k in built else 'absent'} in the model its config builds"
                              + (f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""))
    _DESCRIBED.add(key)


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def _same_run(workdir: str, cfg: Config) -> None:
    """A step whose task or model family is not the run's (WORKDIR/config.json) came from another run: refused."""
    try:
        with open(os.path.join(workdir, "config.json")) as f:
            run = json.load(f)
        theirs = (run["task"], run["model"]["family"])
    except (OSError, ValueError, KeyError, TypeError):
        return  # no run config to compare with (a converted checkpoint, or damage config.json's readers report)
    if theirs != (cfg.task, cfg.model.family):
        raise CheckpointError(f"its config is a {cfg.model.family} model's (task={cfg.task}) but the run trains a "
                              f"{theirs[1]} model (task={theirs[0]}, config.json): a step of another run")
