"""Where metrics go: WORKDIR/metrics.jsonl (one object per logged step), TensorBoard event files,
and a loss-curve PNG written at the end of a run. Only process 0 writes.

metrics.jsonl is strict JSON, one object a line: a non-finite value (NaN, Inf) is written as null. A
run that starts at step `start_step` (0 for a fresh run, the restored step for a resume) first keeps
only the records with step <= start_step, so steps logged after the last checkpoint by a run that was
killed appear once, and a line half-written by a crash is dropped. Readers (read_records, plot) skip
a line that does not parse."""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading


def _clean(v):
    """A JSON value: numbers as float (int stays int), non-finite floats as None."""
    if isinstance(v, bool) or isinstance(v, int) or v is None or isinstance(v, str):
        return v
    if hasattr(v, "__float__"):
        v = float(v)
        return v if math.isfinite(v) else None
    return v


def read_records(path: str) -> list[dict]:
    """The records of a metrics.jsonl, skipping lines that do not parse (a torn last line)."""
    recs = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if isinstance(r, dict):
                    recs.append(r)
    except FileNotFoundError:
        pass
    return recs


def truncate(path: str, start_step: int) -> None:
    """Keep the records of `path` with step <= start_step (whole, parseable lines only), atomically."""
    if not os.path.exists(path):
        return
    keep = [r for r in read_records(path) if isinstance(r.get("step"), (int, float)) and r["step"] <= start_step]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.writelines(json.dumps({k: _clean(v) for k, v in r.items()}, allow_nan=False) + "\n" for r in keep)
    os.replace(tmp, path)


def _summary_writer():
    """tensorboardX's SummaryWriter, imported without PyTorch: tensorboardX imports torch, if installed, only to
    accept torch tensors (2 s at every run's start); zoo logs floats. A torch already imported is left as it is."""
    import sys
    if "torch" in sys.modules:
        from tensorboardX import SummaryWriter
        return SummaryWriter
    sys.modules["torch"] = None  # `import torch` raises ImportError while tensorboardX loads
    try:
        from tensorboardX import SummaryWriter
    finally:
        del sys.modules["torch"]
    return SummaryWriter


_TB_FAILURES: list[OSError] = []  # writes TensorBoard's background thread could not make (a full disk)


def _hold_tb_failures() -> None:
    """TensorBoard's events are written by a thread of tensorboardX: an OSError there (a full disk) would print a
    thread traceback and be lost to the run; held here, it is raised by the next write or close instead."""
    previous = threading.excepthook
    if getattr(previous, "zoo_holds_tb", False):
        return

    def hook(args):
        if isinstance(args.exc_value, OSError) and type(args.thread).__name__ == "_EventLoggerThread":
            _TB_FAILURES.append(args.exc_value)
        else:
            previous(args)
    hook.zoo_holds_tb = True
    threading.excepthook = hook


def _raise_tb_failure() -> None:
    if _TB_FAILURES:
        e = _TB_FAILURES.pop(0)
        _TB_FAILURES.clear()
        raise e


class MetricsWriter:
    def __init__(self, workdir: str, enabled: bool = True, start_step: int = 0):
        self.workdir, self.enabled = workdir, enabled
        self.records: list[dict] = []  # this run's records (values as logged, NaN kept as float)
        self._tb = None
        if enabled:
            os.makedirs(workdir, exist_ok=True)
            path = os.path.join(workdir, "metrics.jsonl")
            truncate(path, start_step)
            self._jsonl = open(path, "a")
            try:
                SummaryWriter = _summary_writer()
                _hold_tb_failures()
                # purge_step: TensorBoard drops what an earlier run logged after the step resumed from.
                self._tb = SummaryWriter(os.path.join(workdir, "tb"),
                                         purge_step=start_step + 1 if start_step else None)
            except ImportError:  # TensorBoard files are optional; jsonl always exists
                self._tb = None

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        record = {k: (float(v) if hasattr(v, "__float__") and not isinstance(v, int) else v)
                  for k, v in record.items()}
        self.records.append(record)
        self._jsonl.write(json.dumps({k: _clean(v) for k, v in record.items()}, allow_nan=False) + "\n")
        self._jsonl.flush()
        _raise_tb_failure()
        if self._tb is not None:
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)) and math.isfinite(v):
                    self._tb.add_scalar(k, v, record["step"])

    def plot(self) -> str | None:
        """Loss curve (train and eval) as WORKDIR/loss.png; reads the whole metrics.jsonl so a
        resumed run's curve includes the steps before the resume."""
        if not self.enabled:
            return None
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        recs = read_records(os.path.join(self.workdir, "metrics.jsonl"))
        fig, ax = plt.subplots(figsize=(6, 4))
        for key in ("loss", "eval_loss"):
            pts = [(r["step"], r[key]) for r in recs if isinstance(r.get(key), (int, float)) and "step" in r]
            if pts:
                ax.plot(*zip(*pts), marker="o" if key == "eval_loss" else None, label=key)
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        if ax.lines:
            ax.legend()
        ax.grid(alpha=0.3)
        path = os.path.join(self.workdir, "loss.png")
        fig.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(fig)
        return path

    def abandon(self) -> None:
        """After a failure (a full disk): close the files quietly, and leave TensorBoard's writer nothing to flush
        at exit (its atexit hook would print a traceback for a write the run already reported)."""
        if not self.enabled:
            return
        with contextlib.suppress(OSError, ValueError):
            self._jsonl.close()
        if self._tb is not None:
            try:
                self._tb.close()
            except Exception:  # its queue or file: mark it closed so the atexit hook does nothing
                for fw in (getattr(self._tb, "all_writers", None) or {}).values():
                    if hasattr(getattr(fw, "event_writer", None), "_closed"):
                        fw.event_writer._closed = True
            self._tb = None

    def close(self) -> None:
        if self.enabled:
            self._jsonl.close()
            if self._tb is not None:
                self._tb.close()
            _raise_tb_failure()
