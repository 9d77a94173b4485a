"""Running the trainer in a test, reading back what a run logged, and writing small data files."""

import json
import os

from zoo.training import trainer


def run(cfg, workdir, **kw):
    """trainer.train without progress bars, handed zoo.load for a distilled run's teacher as zoo.train hands it
    (kw: resume, stop_at_step, devices)."""
    from zoo.api.load import load
    return trainer.train(cfg, str(workdir), progress=False, teacher_of=load, **kw)


def losses(workdir):
    """step -> training loss, as the run in `workdir` logged them to metrics.jsonl."""
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}


def write_jsonl(path, rows):
    """Write `rows` (dicts) to `path`, one JSON object a line; returns the path as a string."""
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return str(path)
