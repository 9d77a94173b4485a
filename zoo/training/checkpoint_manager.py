"""A run's checkpoint directory and the Orbax CheckpointManager that opens it (zoo.training.checkpoint saves and
restores through it).

Layout: WORKDIR/checkpoints/<step>/{params, train, config, digest} (`ckpt_dir`, `step_dir`, `ITEMS`). A run's
manager keeps the newest `train.keep` steps, its last good one (`KeepLatestAndGood`, the step named in
WORKDIR/checkpoints/last_good: `last_good`, `mark_good`) and, for a run watched by reward (zoo.training.objective_watch),
the step its best reward was sampled from (WORKDIR/checkpoints/best_reward: `best_reward`, `mark_best`); a reader's manager is read-only and, within
`_reading_alone`, involves this process alone. Orbax's options that depend on the processes (replica-parallel
writes) are set as each manager is made.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import threading

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint._src.metadata import array_metadata_store  # the Store Orbax's default ArrayHandler has


def ckpt_dir(workdir: str) -> str:
    return os.path.join(os.path.abspath(os.path.expanduser(workdir)), "checkpoints")


def step_dir(workdir: str, step: int) -> str:
    return os.path.join(ckpt_dir(workdir), str(step))


ITEMS = ("params", "train", "config", "digest")


@dataclasses.dataclass
class KeepLatestAndGood:
    """Orbax's preservation policy for a training run: the newest `n` steps (`train.keep`), the run's last
    good step (`good`, set by the trainer as zoo.training.guard confirms steps), however old it gets, so a slow
    climb that outlasts `keep` saves still leaves a checkpoint to go back to, and (an RL run) the step whose params
    sampled the best training reward so far (`best`, its reward `best_value`: zoo.training.objective_watch), so a
    collapse that outlasts `keep` saves still leaves the policy that did best."""
    n: int
    good: int | None = None
    best: int | None = None
    best_value: float | None = None

    def kept(self) -> set:
        return {s for s in (self.good, self.best) if s is not None}

    def should_preserve(self, checkpoints, *, context=None) -> list[bool]:
        first = len(checkpoints) - self.n
        return [i >= first or c.step in self.kept() for i, c in enumerate(checkpoints)]


LAST_GOOD = "last_good"  # WORKDIR/checkpoints/last_good: the step number of the last good checkpoint
BEST_REWARD = "best_reward"  # WORKDIR/checkpoints/best_reward: "STEP REWARD" of the best-reward checkpoint


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
    policy = None if read_only else KeepLatestAndGood(keep, last_good(workdir), *(best_reward(workdir) or ()))
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
    """The step marked last good (zoo.training.guard), if it is still among the run's checkpoints."""
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



def best_reward(workdir: str) -> tuple[int, float] | None:
    """(step, reward) of the checkpoint marked best by reward (zoo.training.objective_watch), if still in the run."""
    try:
        with open(os.path.join(ckpt_dir(workdir), BEST_REWARD)) as f:
            step, value = f.read().split()
        step, value = int(step), float(value)
    except (OSError, ValueError):
        return None
    return (step, value) if os.path.isdir(step_dir(workdir, step)) else None


def mark_best(mngr, step: int, value: float) -> None:
    """Protect `step` from rotation as the checkpoint whose params sampled the run's best reward, `value`."""
    if mngr.zoo_policy is None or (mngr.zoo_policy.best, mngr.zoo_policy.best_value) == (step, value):
        return
    mngr.zoo_policy.best, mngr.zoo_policy.best_value = step, value
    if jax.process_index() == 0:
        path = os.path.join(str(mngr.directory), BEST_REWARD)
        with open(path + ".tmp", "w") as f:
            f.write(f"{step} {value!r}\n")
        os.replace(path + ".tmp", path)
