"""The benchmark parent: start one worker process per framework, alternate timed rounds between them so
that both see the same machine conditions, and summarise medians, minima and zoo / peer ratios."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from zoo.bench import shapes as bench_shapes
from zoo.bench.common import median

ROUNDS, WARMUP = 5, 2


class Worker:
    """A `python -m zoo.bench.worker FRAMEWORK` process answering one JSON line per request."""

    def __init__(self, framework: str, spec: dict):
        self.framework = framework
        self.proc = subprocess.Popen([sys.executable, "-m", "zoo.bench.worker", framework, json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        self.ready = self._read()  # setup + compile + warm-up report

    def _read(self) -> dict:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{self.framework} worker exited (code {self.proc.wait()})")
            if line.startswith("{"):
                out = json.loads(line)
                if "error" in out:
                    raise RuntimeError(f"{self.framework} worker: {out['error']}")
                return out

    def ask(self, what: str) -> dict:
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        self.proc.wait(timeout=60)


def run_spec(spec: dict, peer: str | None, rounds: int) -> dict:
    workers = {"zoo": Worker("zoo", spec)}
    if peer and spec["workload"] in bench_shapes.PEER_WORKLOADS:
        try:
            workers["peer"] = Worker(peer, spec)
        except RuntimeError as e:
            print(f"peer {peer} skipped for {spec['workload']}: {e}", file=sys.stderr)
    times = {k: [] for k in workers}
    for _ in range(WARMUP):
        for w in workers.values():
            w.ask("round")
    for _ in range(rounds):
        for k, w in workers.items():  # alternate: each round of zoo is followed by one of the peer
            times[k].append(w.ask("round"))
    final = {k: w.ask("final") for k, w in workers.items()}
    for w in workers.values():
        w.close()
    return summarise(spec, {k: (workers[k].ready, times[k], final[k]) for k in workers})


def summarise(spec: dict, results: dict) -> dict:
    ready, rounds, final = results["zoo"]
    row = {"workload": spec["workload"], "shape": spec["name"], **{k: ready[k] for k in
           ("device_kind", "device_count", "compile_s", "peak_flops", "settings") if k in ready}}
    for key in rounds[0]:
        if key.endswith("_s"):  # per-round durations: median and min
            row[f"{key}_median"] = median([r[key] for r in rounds])
            row[f"{key}_min"] = min(r[key] for r in rounds)
        else:  # per-round fractions (input wait): the median
            row[key] = median([r[key] for r in rounds])
    row.update(final)
    if "peer" in results:
        p_ready, p_rounds, p_final = results["peer"]
        peer = dict(p_final)
        for key in p_rounds[0]:
            peer[f"{key}_median"] = median([r[key] for r in p_rounds])
        row["peer"] = {"name": p_ready.get("name"), **peer}
        for key in ("tokens_per_s", "decode_tokens_per_s", "sequences_per_s"):
            if key in row and key in peer and peer[key]:
                row[f"ratio_{key}"] = row[key] / peer[key]
    return row


def table(rows: list[dict]) -> str:
    cols = ["workload", "shape", "tokens_per_s", "mfu", "step_s_median", "input_wait_frac", "compile_s",
            "peak_memory_mb", "ratio_tokens_per_s", "ratio_decode_tokens_per_s"]
    cols = [c for c in cols if any(c in r for r in rows)]
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)
    lines = [" | ".join(cols), " | ".join("---" for _ in cols)]
    lines += [" | ".join(fmt(r.get(c, "")) for c in cols) for r in rows]
    return "\n".join(lines)
