"""Where a streamed input stood at each checkpoint (zoo.data.stream): one small JSON file per process and
checkpointed step, `WORKDIR/data_state/STEP.pPROCESS.json`, written (atomically) before the step's
checkpoint, read when a run resumes from that step, and pruned with the checkpoints. Inputs cut from a
token store need none: their batches are a function of (seed, step).
"""

from __future__ import annotations

import json
import os
import re

import jax

from zoo.errors import TrainError

DIR = "data_state"


def _path(workdir: str, step: int, process: int) -> str:
    return os.path.join(workdir, DIR, f"{step}.p{process}.json")


def save(train, workdir: str, step: int, kept: list[int]) -> None:
    """The stream's position before `step`, for this process, written before step's checkpoint is."""
    if not hasattr(train, "state"):
        return
    path = _path(workdir, step, jax.process_index())
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(train.state(step), f)
    os.replace(path + ".tmp", path)
    prune(workdir, [*kept, step])


def prune(workdir: str, kept: list[int]) -> None:
    """This process's states of steps no longer checkpointed go (`kept`: the checkpointed steps; one newer
    than all of them may still be saving, so it stays)."""
    folder = os.path.join(workdir, DIR)
    if not kept or not os.path.isdir(folder):
        return
    for name in os.listdir(folder):
        m = re.fullmatch(rf"(\d+)\.p{jax.process_index()}\.json", name)
        if m and int(m.group(1)) not in kept and int(m.group(1)) < max(kept):
            os.remove(os.path.join(folder, name))


def restore(train, workdir: str, step: int) -> None:
    """Seek a streamed input to where it stood at checkpoint `step` (a fresh run: its start)."""
    if not hasattr(train, "restore") or step == 0:
        return
    path = _path(workdir, step, jax.process_index())
    if not os.path.exists(path):
        raise TrainError(f"{path} is missing: a run with data.streaming=true resumes where its stream stood at step "
                         f"{step}, and that file says where (it is written beside each checkpoint)")
    with open(path) as f:
        train.restore(step, json.load(f))
