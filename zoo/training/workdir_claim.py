"""Taking a run's workdir before training: the lock (zoo.training.workdir.claim), held by process 0 while the
others wait for its verdict (zoo.training.peers), and the check that the workdir can start a fresh run (it holds
no checkpoints) or be resumed (it holds a train state, in its own directory)."""

from __future__ import annotations

import contextlib
import os

from zoo.errors import TrainError
from zoo.training import checkpoint, peers
from zoo.training.workdir import claim


def check_workdir(workdir: str, resume: bool) -> None:
    """Refuse a workdir this run cannot use: checkpoints linked from outside it, nothing to resume (no step,
    or weights only), or checkpoints already there for a fresh run."""
    ck, root = checkpoint.ckpt_dir(workdir), os.path.realpath(workdir)
    if os.path.exists(ck) and os.path.commonpath([os.path.realpath(ck), root]) != root:
        raise TrainError(f"{ck} is a link to {os.path.realpath(ck)}, outside the run {workdir!r}: a run writes only "
                         f"into its own directory (copy the checkpoints in instead of linking them)")
    steps = checkpoint.all_steps(workdir)
    if resume and not steps:
        checkpoint.require_latest(workdir)
    if resume and not any(checkpoint.has_train_state(workdir, st) for st in steps):
        raise TrainError(f"{workdir!r} holds weights only (a converted checkpoint), nothing to resume; "
                         f"fine-tune from it with --set init_from={workdir}")
    if not resume and steps:
        raise TrainError(f"workdir {workdir!r} already holds checkpoints; continue it with "
                         f"`python train.py --resume {workdir}` or pick another --workdir")


@contextlib.contextmanager
def claimed(path: str, main: bool, check):
    """The workdir lock, taken by process 0 alone after `check()` (zoo.training.workdir.claim); the other processes
    wait for its verdict (zoo.training.peers). With several processes every one runs `check()` together once the lock
    is held: Orbax's reads of the steps synchronise the processes, so process 0 checking alone, while the others
    wait for its verdict, would wait for them forever."""
    k, told = peers.key("workdir"), False
    several = peers.several()
    peers.wait(k, f"the workdir {path!r}")
    try:
        with claim(path, enabled=main, check=None if several else check) as created:
            peers.tell(k, None)
            told = True
            if several:
                check()
            yield created
    except BaseException as e:
        if not told:
            peers.tell(k, e)
        raise
