"""Where metrics go: WORKDIR/metrics.jsonl (one object per logged step), TensorBoard event files,
and a loss-curve PNG written at the end of a run. Only process 0 writes."""

from __future__ import annotations

import json
import math
import os


class MetricsWriter:
    def __init__(self, workdir: str, enabled: bool = True):
        self.workdir, self.enabled = workdir, enabled
        self.records: list[dict] = []
        self._tb = None
        if enabled:
            os.makedirs(workdir, exist_ok=True)
            self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a")
            try:
                from tensorboardX import SummaryWriter
                self._tb = SummaryWriter(os.path.join(workdir, "tb"))
            except ImportError:  # TensorBoard files are optional; jsonl always exists
                self._tb = None

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        record = {k: (float(v) if hasattr(v, "__float__") and not isinstance(v, int) else v)
                  for k, v in record.items()}
        self.records.append(record)
        self._jsonl.write(json.dumps(record) + "\n")
        self._jsonl.flush()
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
        with open(os.path.join(self.workdir, "metrics.jsonl")) as f:
            recs = [json.loads(line) for line in f if line.strip()]
        fig, ax = plt.subplots(figsize=(6, 4))
        for key in ("loss", "eval_loss"):
            pts = [(r["step"], r[key]) for r in recs if key in r]
            if pts:
                ax.plot(*zip(*pts), marker="o" if key == "eval_loss" else None, label=key)
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.legend()
        ax.grid(alpha=0.3)
        path = os.path.join(self.workdir, "loss.png")
        fig.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(fig)
        return path

    def close(self) -> None:
        if self.enabled:
            self._jsonl.close()
            if self._tb is not None:
                self._tb.close()
