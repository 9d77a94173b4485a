"""The errors a run ends with, each one line saying what to do next: a step that blew up or diverged (`diverged`:
the checkpoint to go back to, the ones after the blow-up moved aside) and a write the disk refused (`DISK_ERRNOS`,
`disk_failure`: half-written files removed, the checkpoints kept)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import time

import jax

from zoo.errors import TrainError
from zoo.training import checkpoint, data_state


def diverged(bad_step: int, what: str, finite: bool, came_in_bad: bool, workdir: str, mngr, guard=None) -> TrainError:
    """The error of a bad step: which step and what happened, and the checkpoint to resume from with a
    lower learning rate. Every saved state is finite (`save` refuses NaN/Inf); when the step came in with bad
    params (a blow-up, zoo.training.guard, or a NaN loss), the checkpoints from the step before it on hold them,
    so they are moved aside into WORKDIR/checkpoints-blown-up/ (kept). The step named is the last good one
    (zoo.training.guard: the loss after it was calm), which may be older than the newest left when the loss
    climbed for a while before it blew up; `--resume --step` goes back to it."""
    checkpoint.finish(mngr)
    aside = ""
    if came_in_bad:
        suspect = [st for st in checkpoint.all_steps(workdir) if st >= bad_step - 1]
        if suspect and jax.process_index() == 0:
            where = os.path.join(workdir, "checkpoints-blown-up")
            os.makedirs(where, exist_ok=True)
            for st in suspect:
                shutil.move(checkpoint.step_dir(workdir, st),
                            os.path.join(where, f"{st}-{time.strftime('%Y%m%d-%H%M%S')}"))
            aside = f"; its checkpoints from step {min(suspect)} on were moved aside into {where}"
    steps = [st for st in checkpoint.all_steps(workdir) if st < bad_step - 1 or not came_in_bad]
    newest = steps[0] if steps else None
    good = guard.confirmed(steps) if guard is not None else None
    if good is None and mngr.zoo_policy is not None and mngr.zoo_policy.good in steps:
        good = mngr.zoo_policy.good
    resume = f"python train.py --resume {workdir}"
    if newest is None:
        where = ("no checkpoint from before it is left: start again with a lower learning rate" if aside else
                 "no checkpoint was saved before it")
    elif not came_in_bad or good == newest:
        where = (f"the newest checkpoint, step {newest} in {checkpoint.ckpt_dir(workdir)}, is "
                 f"{'good' if came_in_bad else 'finite'}; resume from it with a lower learning rate: "
                 f"{resume} --set optim.lr=...")
    elif good is not None:
        climbed = [st for st in steps if st > good]
        where = (f"the last good checkpoint is step {good} in {checkpoint.ckpt_dir(workdir)} (the loss was already "
                 f"climbing after it; {'step' if len(climbed) == 1 else 'steps'} "
                 f"{', '.join(map(str, sorted(climbed)))} "
                 f"{'is' if len(climbed) == 1 else 'are'} kept but not good); resume from it with a "
                 f"lower learning rate: {resume} --step {good} --set optim.lr=...")
    else:
        where = (f"the newest checkpoint, step {newest} in {checkpoint.ckpt_dir(workdir)}, is finite but not confirmed "
                 f"good (the loss was already climbing after it); resume from it with a much lower learning rate: "
                 f"{resume} --set optim.lr=...")
    return TrainError(f"training {'blew up' if finite else 'diverged'}: {what} at step {bad_step}; stopped{aside}; "
                      f"{where}")


# A write that fails for one of these reasons is the disk's fault, not the run's: one line, nothing half-written.
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO)


def disk_failure(e: OSError, path: str) -> TrainError:
    """A write of the run (checkpoint marker, data state, metrics, TensorBoard, config, tokenizer, base) that
    failed: its half-written .tmp files removed, the checkpoints kept, and what to do next in one line."""
    for d in (path, checkpoint.ckpt_dir(path), os.path.join(path, data_state.DIR)):
        if os.path.isdir(d):
            for name in os.listdir(d):
                if name.endswith(".tmp") and os.path.isfile(os.path.join(d, name)):
                    with contextlib.suppress(OSError):
                        os.remove(os.path.join(d, name))
    steps = checkpoint.all_steps(path) if os.path.isdir(path) else []
    then = f"python train.py --resume {path}" if steps else "run the same command again"
    where = f"writing {e.filename}" if e.filename else f"writing in {path}"
    return TrainError(f"{where} failed: {e.strerror or e}; the run stopped (free space or fix permissions, then "
                      f"{then})")
