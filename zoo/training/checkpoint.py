"""Orbax CheckpointManager wrapper: save / restore / resume, checksums, and the fallback past damaged steps.
Reading a run's config and weights for use (sampling, init_from, conversion, zoo.load) is zoo.training.runs.
The directory layout and the manager itself (keep policy, the last good step, readers alone) are
zoo.training.checkpoint_manager; the config saved beside each step (portable paths, restore_config and its checks)
is zoo.training.checkpoint_config. Their names are imported here too, so callers keep reading them from this module.

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

import json
import os
import shutil
import sys
import time

import jax
import orbax.checkpoint as ocp

from zoo.configuration import Config
from zoo.errors import CheckpointError, ConfigError
from zoo.training import orbax_errors
from zoo.training.checkpoint_config import HERE, PATH_FIELDS, located, portable, restore_config  # noqa: F401
from zoo.training.checkpoint_manager import (  # noqa: F401 (ITEMS ... _reading_alone: read from here by others)
    ITEMS, LAST_GOOD, KeepLatestAndGood, _absl_errors_only, _alone, _reading_alone, ckpt_dir, last_good, manager,
    mark_good, step_dir)
from zoo.training.checksums import fingerprint


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
            if type(e).__name__ == "BaseError":  # zoo.training.runs: the run's base, not this step, is at fault
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
            raise CheckpointError(f"--step {step}: {ckpt_dir(workdir)} holds steps "
                                  f"{', '.join(map(str, steps)) or 'none'}")
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
    """Delete the oldest steps beyond `keep`, the last good one and the best reward's aside (a kill between a save and Orbax's
    cleanup leaves one extra)."""
    kept = mngr.zoo_policy.kept() if mngr.zoo_policy is not None else set()
    for s in sorted(mngr.all_steps())[:-keep] if keep else []:
        if s not in kept:
            mngr.delete(s)




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
