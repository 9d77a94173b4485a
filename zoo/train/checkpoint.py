"""Orbax CheckpointManager wrapper: save / restore / resume, checksums, and the fallback past damaged steps.
Reading a run's config and weights for use (sampling, init_from, conversion, zoo.load) is zoo.train.runs.

Layout: WORKDIR/checkpoints/<step>/{params, train, config, digest}. `params` is stored as its own item
so sampling, fine-tuning (`init_from`) and conversion read only the weights. Orbax writes each step
into a temporary directory and renames it when complete, so an interrupted save never replaces a
good checkpoint; saves are asynchronous and `close()` waits for the last one.

Trust: a state is saved only when every float in its params and optimizer state is finite, with a
`digest` item holding a checksum per array (`fingerprint`), verified whenever the arrays are read back.
Every reader (resume, sampling, init_from, conversion) takes the newest step that restores and
verifies: a step that fails (a missing item, an Orbax/tensorstore/JSON error, a checksum mismatch) is
reported in one line with its path and reason, and the next older step is tried.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import sys
import threading
import time

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint._src.metadata import array_metadata_store  # the Store Orbax's default ArrayHandler has

from zoo.config import Config, from_dict
from zoo.errors import CheckpointError, ConfigError
from zoo.train import orbax_errors
from zoo.train.checksums import fingerprint


def ckpt_dir(workdir: str) -> str:
    return os.path.join(os.path.abspath(os.path.expanduser(workdir)), "checkpoints")


def step_dir(workdir: str, step: int) -> str:
    return os.path.join(ckpt_dir(workdir), str(step))


ITEMS = ("params", "train", "config", "digest")


@dataclasses.dataclass
class KeepLatestAndGood:
    """Orbax's preservation policy for a training run: the newest `n` steps (`train.keep`) and the run's last
    good step (`good`, set by the trainer as zoo.train.guard confirms steps), however old it gets, so a slow
    climb that outlasts `keep` saves still leaves a checkpoint to go back to."""
    n: int
    good: int | None = None

    def should_preserve(self, checkpoints, *, context=None) -> list[bool]:
        first = len(checkpoints) - self.n
        return [i >= first or c.step == self.good for i, c in enumerate(checkpoints)]


LAST_GOOD = "last_good"  # WORKDIR/checkpoints/last_good: the step number of the last good checkpoint


_ALONE = threading.local()  # .on: this process reads by itself (load_weights), not with its peers


@contextlib.contextmanager
def _reading_alone():
    """Within: read-only managers involve this process only. A reader (zoo-eval, sampling, init_from) may run on
    one process of several without the others making the same calls; Orbax's default waits for all of them
    at a barrier when the manager opens, and a peer that does not come hangs it."""
    before = getattr(_ALONE, "on", False)
    _ALONE.on = True
    try:
        yield
    finally:
        _ALONE.on = before


def _alone() -> dict:
    """Orbax's multiprocessing options for a process reading by itself (within `_reading_alone`), else none."""
    if not getattr(_ALONE, "on", False) or jax.process_count() == 1:
        return {}
    me = jax.process_index()
    return {"multiprocessing_options": ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me})}


def _replica_parallel_when_it_pays() -> None:
    """Orbax splits the writing of a replicated array among its replicas, so that each process writes a
    part: worth it across processes. In one process, that process writes every part anyway, through one
    compiled slice per shard shape (72 compiles on the first save of a tiny GPT on 8 CPU devices, 6 s): off
    there, as Orbax itself has it on GPUs. Set as each manager is made, once jax.distributed has started."""
    several = jax.process_count() > 1
    if getattr(ocp.type_handlers.get_type_handler(jax.Array), "_use_replica_parallel", several) != several:
        with _absl_errors_only():  # the registry warns that it overrides jax.Array's handler: as meant
            ocp.type_handlers.register_type_handler(jax.Array, ocp.type_handlers.ArrayHandler(
                use_replica_parallel=several, array_metadata_store=array_metadata_store.Store()), override=True)


@contextlib.contextmanager
def _absl_errors_only():
    """Orbax's absl log lines below ERROR are left out while this holds."""
    log = logging.getLogger("absl")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def manager(workdir: str, keep: int = 3, async_save: bool = True, read_only: bool = False):
    _replica_parallel_when_it_pays()
    if not read_only and jax.process_index() == 0:
        _remove_unfinished(workdir)
    # Readers open the manager with create=False and never save; orbax's read_only mode only logs noise.
    policy = None if read_only else KeepLatestAndGood(keep, last_good(workdir))
    options = ocp.CheckpointManagerOptions(preservation_policy=policy, create=not read_only,
                                           enable_async_checkpointing=async_save and not read_only,
                                           **(_alone() if read_only else {}))
    for tries_left in reversed(range(5)):
        try:
            mngr = ocp.CheckpointManager(ckpt_dir(workdir), options=options, item_names=ITEMS)
            break
        except (FileNotFoundError, NotADirectoryError):
            # Orbax stats every step as it lists them: a step that a run still training deletes meanwhile
            # (train.keep) is gone, not damaged, and no fault of the step being read. List again.
            if not read_only or not tries_left:
                raise
    mngr.zoo_policy = policy
    return mngr


def _remove_unfinished(workdir: str) -> None:
    """A save interrupted (kill -9) leaves STEP.orbax-checkpoint-tmp*: never a step, so no reader lists it, and the
    run that saves again removes it, which Orbax does with a WARNING:absl: line on the console. The run that owns
    the workdir (it holds its lock) removes them first, quietly: the step it was saving is trained again."""
    d = ckpt_dir(workdir)
    for name in os.listdir(d) if os.path.isdir(d) else []:
        if ".orbax-checkpoint-tmp" in name and name.split(".", 1)[0].isdigit():
            shutil.rmtree(os.path.join(d, name), ignore_errors=True)


def last_good(workdir: str) -> int | None:
    """The step marked last good (zoo.train.guard), if it is still among the run's checkpoints."""
    try:
        with open(os.path.join(ckpt_dir(workdir), LAST_GOOD)) as f:
            step = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return step if os.path.isdir(step_dir(workdir, step)) else None


def mark_good(mngr, step: int) -> None:
    """Protect `step` from rotation as the run's last good checkpoint (the one before is released)."""
    if mngr.zoo_policy is None or mngr.zoo_policy.good == step:
        return
    mngr.zoo_policy.good = step
    if jax.process_index() == 0:
        path = os.path.join(str(mngr.directory), LAST_GOOD)
        with open(path + ".tmp", "w") as f:
            f.write(f"{step}\n")
        os.replace(path + ".tmp", path)


def all_steps(workdir: str) -> list[int]:
    """The run's checkpoint steps, newest first."""
    if not os.path.isdir(ckpt_dir(workdir)):
        return []
    with manager(workdir, read_only=True) as m:
        return sorted(m.all_steps(), reverse=True)


def latest_step(workdir: str) -> int | None:
    steps = all_steps(workdir)
    return steps[0] if steps else None


def require_latest(workdir: str) -> int:
    step = latest_step(workdir)
    if step is None:
        raise CheckpointError(f"no checkpoint in {workdir!r} (looked for {ckpt_dir(workdir)}/<step>); "
                              f"train first: python train.py CONFIG --workdir {workdir}")
    return step


def _train_item(state) -> dict:
    return {"step": state.step, "opt_state": state.opt_state, "rng": state.rng}


class NonFiniteState(Exception):
    """The state to save holds NaN/Inf: it was not saved."""


def save(mngr, state, cfg: Config, force: bool = False) -> None:
    """Save `state` as its step, with a checksum per array. Raises NonFiniteState (nothing saved) if any
    float of params or optimizer state is NaN/Inf, SaveError if Orbax fails (an earlier asynchronous save
    included)."""
    step = int(jax.device_get(state.step))
    _mark_checksummed(os.path.dirname(str(mngr.directory)))
    params_digest, params_finite = fingerprint(state.params)
    train_digest, train_finite = fingerprint(_train_item(state))
    if not (params_finite and train_finite):
        raise NonFiniteState(f"step {step}: {'params' if not params_finite else 'optimizer state'} hold NaN/Inf")
    with orbax_errors.as_save_error(mngr.directory, f" (at step {step})"):
        mngr.save(step, force=force, args=ocp.args.Composite(
            params=ocp.args.StandardSave(state.params),
            train=ocp.args.StandardSave(_train_item(state)),
            config=ocp.args.JsonSave(portable(cfg.to_dict(), os.path.dirname(str(mngr.directory)))),
            digest=ocp.args.JsonSave({"params": params_digest, "train": train_digest})))


def check_for_errors(mngr) -> None:
    """Raise SaveError now if an asynchronous save has failed (called at every log step)."""
    with orbax_errors.as_save_error(mngr.directory):
        mngr.check_for_errors()


def finish(mngr) -> None:
    """Wait for the last asynchronous save and close; a failed save -> SaveError (one line)."""
    try:
        with orbax_errors.as_save_error(mngr.directory):
            mngr.wait_until_finished()
    finally:
        try:
            mngr.close()
        except Exception:
            pass  # the failure itself was raised above


# ---- reading back: verified, newest step that restores ----

def _reason(e: BaseException) -> str:
    """One line saying why a step did not restore."""
    msg = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
    msg = msg.split("See full TensorStore details")[0].strip() or type(e).__name__
    first = msg.splitlines()[0][:240]
    if "reading array index" in first:
        return f"an array file is missing or truncated (tensorstore: {first.rstrip('.')})"
    return first if isinstance(e, (CheckpointError, ConfigError)) else f"{type(e).__name__}: {first}"


# Beside the checkpoints of a run whose every step carries checksums: a step of it without `digest/` lost
# them (damage); only the steps of a run from before checksums existed may go unverified (said once).
CHECKSUMMED = ".checksummed"
_UNVERIFIED: set = set()


def _mark_checksummed(workdir: str) -> None:
    path = os.path.join(ckpt_dir(workdir), CHECKSUMMED)
    if jax.process_index() == 0 and not os.path.exists(path):
        os.makedirs(ckpt_dir(workdir), exist_ok=True)
        open(path, "w").close()


def _checksummed(workdir: str, step: int) -> bool:
    """Whether `step` was saved with checksums. The run's marker says so, but it is one file that can go: the
    step's own Orbax metadata naming a `digest` item, or any other step of the run holding one, say so too."""
    if os.path.exists(os.path.join(ckpt_dir(workdir), CHECKSUMMED)):
        return True
    try:
        with open(os.path.join(step_dir(workdir, step), "_CHECKPOINT_METADATA")) as f:
            if "digest" in json.load(f).get("item_handlers", {}):
                return True
    except (OSError, ValueError, AttributeError):
        pass
    others = [n for n in os.listdir(ckpt_dir(workdir)) if n.isdigit()] if os.path.isdir(ckpt_dir(workdir)) else []
    return any(os.path.isdir(os.path.join(ckpt_dir(workdir), n, "digest")) for n in others)


def _verify(workdir: str, step: int, item: str, tree) -> None:
    """Compare `tree`'s checksums with those saved beside it. A run from before checksums existed is read
    unverified (said once); in a run that has them, a step without them is damaged."""
    path = os.path.join(step_dir(workdir, step), "digest", "metadata")
    if not os.path.isdir(os.path.dirname(path)):
        if _checksummed(workdir, step):
            raise CheckpointError("its digest/ (the checksums every step of this run has) is missing")
        if ckpt_dir(workdir) not in _UNVERIFIED and jax.process_index() == 0:
            _UNVERIFIED.add(ckpt_dir(workdir))
            print(f"note: {ckpt_dir(workdir)} was written before checkpoints carried checksums; read unverified",
                  file=sys.stderr, flush=True)
        return
    with open(path) as f:
        saved = json.load(f)[item]
    got, _ = fingerprint(tree)
    bad = sorted(k for k in set(saved) | set(got) if saved.get(k) != got.get(k))
    if bad:
        raise CheckpointError(f"{item}{bad[0]} does not match its saved checksum"
                              + (f" (and {len(bad) - 1} more arrays)" if len(bad) > 1 else "")
                              + ": the files are damaged")


# A damaged step is reported once a process: `--resume` reads the config (zoo.cli.train) before the trainer
# restores the whole step, and both fall back past the same damage.
_REPORTED: set = set()


orbax_errors.hold_read_echoes()


def _being_deleted(workdir: str, step: int, wait: float = 1.0) -> bool:
    """Whether `step`, which just failed to read, is gone or going: a run training beside the reader rotates its
    steps out (train.keep) and a step deleted halfway is still listed for a moment, so it is looked for again a
    few times within `wait` seconds before its failure is called damage."""
    for _ in range(5):
        if step not in all_steps(workdir):
            return True
        here = step_dir(workdir, step)
        whole = all(os.path.exists(os.path.join(here, n)) for n in ("params", "config", "_CHECKPOINT_METADATA"))
        if not whole and _written_within(workdir, 60):
            time.sleep(wait / 5)  # half deleted, by a run writing now: look again
            continue
        return False
    return step not in all_steps(workdir)


def _written_within(workdir: str, seconds: float) -> bool:
    try:
        return time.time() - os.stat(os.path.join(workdir, "metrics.jsonl")).st_mtime < seconds
    except OSError:
        return False


def first_restorable(workdir: str, load, steps: list[int] | None = None, relists: int = 3):
    """(step, load(step)) for the newest step where `load` succeeds. Each step that fails is reported on
    stderr in one line (its path and the reason; once a process) before the next older one is tried;
    CheckpointError naming every step tried if none restores."""
    steps = all_steps(workdir) if steps is None else steps
    if not steps:  # none, or the first just saved and not yet listed by Orbax: require_latest looks again
        steps = [require_latest(workdir)]
    failed = []
    for i, step in enumerate(steps):
        try:
            return step, load(step)
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as e:
            if type(e).__name__ == "BaseError":  # zoo.train.runs: the run's base, not this step, is at fault
                raise
            if _being_deleted(workdir, step):  # pruned by a run still training (keep=1): gone, not damaged
                fresh = [s for s in all_steps(workdir) if s not in steps]
                if fresh:  # a newer step was saved meanwhile: read it instead
                    return first_restorable(workdir, load, fresh + steps[i + 1:], relists)
                continue
            failed.append(f"step {step} ({_reason(e)})")
            after = f"trying step {steps[i + 1]}" if i + 1 < len(steps) else "no older step"
            line = f"warning: checkpoint {step_dir(workdir, step)} does not restore: {_reason(e)}; {after}"
            if jax.process_index() == 0 and line not in _REPORTED:
                _REPORTED.add(line)
                print(line, file=sys.stderr, flush=True)
    if not failed and relists:  # every step listed was pruned as it was read, the newer not listed yet: again
        return first_restorable(workdir, load, None, relists - 1)
    raise CheckpointError(f"no checkpoint in {ckpt_dir(workdir)} restores; tried " + ", ".join(failed))


def restore(mngr, step: int, abstract_state, workdir: str | None = None):
    """Restore the whole TrainState of `step`, verified against its checksums when `workdir` is given;
    `abstract_state` holds ShapeDtypeStructs with shardings."""
    a = abstract_state
    out = mngr.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(a.params),
        train=ocp.args.StandardRestore({"step": a.step, "opt_state": a.opt_state, "rng": a.rng})))
    if workdir is not None:
        _verify(workdir, step, "params", out["params"])
        _verify(workdir, step, "train", out["train"])
    t = out["train"]
    return a.replace(step=t["step"], params=out["params"], opt_state=t["opt_state"], rng=t["rng"])


def restore_latest(workdir: str, abstract_state, step: int | None = None):
    """(step, TrainState) of the newest step that restores and verifies, for resuming. Newer steps that did
    not restore are moved aside into WORKDIR/checkpoints-damaged/ (kept for inspection, out of Orbax's way).
    With `step` (--resume --step N), that step exactly, and the newer ones, good or not, are moved aside into
    WORKDIR/checkpoints-superseded/ once it restored: the run goes on from N and nothing is deleted."""
    asked = step is not None
    with manager(workdir, read_only=True) as m:
        steps = sorted(m.all_steps(), reverse=True)
        if asked and step not in steps:
            raise CheckpointError(f"--step {step}: {ckpt_dir(workdir)} holds steps {', '.join(map(str, steps)) or 'none'}")
        # A step restores whole or not at all: its config too, so the run goes on with the config of its state.
        load = lambda s: (restore_config(workdir, s), restore(m, s, abstract_state, workdir))[1]  # noqa: E731
        if asked:
            try:
                state = load(step)
            except Exception as e:  # noqa: BLE001 - the step asked for does not restore: no fallback
                raise CheckpointError(f"--step {step}: checkpoint {step_dir(workdir, step)} does not restore: "
                                      f"{_reason(e)}") from None
        else:
            step, state = first_restorable(workdir, load, steps)
    newer = [s for s in steps if s > step]
    if newer and jax.process_index() == 0:
        kind = "superseded" if asked else "damaged"
        aside = os.path.join(os.path.dirname(ckpt_dir(workdir)), f"checkpoints-{kind}")
        os.makedirs(aside, exist_ok=True)
        for s in newer:
            shutil.move(step_dir(workdir, s), os.path.join(aside, f"{s}-{time.strftime('%Y%m%d-%H%M%S')}"))
    if newer and jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices("zoo: newer checkpoints moved aside")
    return step, state


def prune(mngr, keep: int) -> None:
    """Delete the oldest steps beyond `keep`, the last good one aside (a kill between a save and Orbax's
    cleanup leaves one extra)."""
    good = mngr.zoo_policy.good if mngr.zoo_policy is not None else None
    for s in sorted(mngr.all_steps())[:-keep] if keep else []:
        if s != good:
            mngr.delete(s)


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


def save_weights(workdir: str, params, cfg: Config, step: int = 0) -> None:
    """A weights-only checkpoint (converted models): `params`, `config` and checksums, no optimizer state.
    Sampling, `init_from` and `to-hf` read it; `--resume` does not apply."""
    digest, _ = fingerprint(params)
    _mark_checksummed(workdir)
    with manager(workdir, async_save=False) as m:
        m.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(params),
                                             config=ocp.args.JsonSave(portable(cfg.to_dict(), workdir)),
                                             digest=ocp.args.JsonSave({"params": digest})))


def has_train_state(workdir: str, step: int) -> bool:
    return os.path.isdir(os.path.join(step_dir(workdir, step), "train"))
