"""Benchmarks: step time, tokens/s, MFU, memory and compile time of zoo's hot paths, optionally
beside transformers (PyTorch) on the same shapes.

    python -m zoo.bench --workload gpt_train --preset gpt2_small --seq-len 1024 --batch 8 --dtype bfloat16
    python -m zoo.bench --out bench.jsonl                    # every workload, one JSON line each, then a table
    python -m zoo.bench --shapes cpu --peer hf-torch         # the scaled CPU shapes, transformers side by side

Each framework runs in its own worker process; the parent alternates timed rounds between them
so that both see the same machine conditions, and reports medians and minima over rounds. Ratios
are zoo / peer measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from zoo import bench_shapes

ROUNDS, WARMUP = 5, 2


class Worker:
    """A `python -m zoo.bench_worker FRAMEWORK` process answering one JSON line per request."""

    def __init__(self, framework: str, spec: dict):
        self.framework = framework
        self.proc = subprocess.Popen([sys.executable, "-m", "zoo.bench_worker", framework, json.dumps(spec)],
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


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else 0.5 * (xs[len(xs) // 2 - 1] + xs[len(xs) // 2])


def summarise(spec: dict, results: dict) -> dict:
    ready, rounds, final = results["zoo"]
    row = {"workload": spec["workload"], "shape": spec["name"], **{k: ready[k] for k in
           ("device_kind", "device_count", "compile_s", "peak_flops", "settings") if k in ready}}
    for key in rounds[0]:
        if key.endswith("_s"):  # per-round durations: median and min
            row[f"{key}_median"] = _median([r[key] for r in rounds])
            row[f"{key}_min"] = min(r[key] for r in rounds)
        else:  # per-round fractions (input wait): the median
            row[key] = _median([r[key] for r in rounds])
    row.update(final)
    if "peer" in results:
        p_ready, p_rounds, p_final = results["peer"]
        peer = dict(p_final)
        for key in p_rounds[0]:
            peer[f"{key}_median"] = _median([r[key] for r in p_rounds])
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zoo.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--workload", choices=bench_shapes.WORKLOADS, action="append",
                    help="repeatable; default: all")
    ap.add_argument("--shapes", choices=("full", "cpu"), default="full",
                    help="full: the published shapes; cpu: the scaled shapes for a CPU")
    ap.add_argument("--preset", help="model preset for the train workloads (e.g. gpt2_small, bert_base)")
    ap.add_argument("--seq-len", type=int)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"))
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--peer", choices=("hf-torch",), help="run transformers (PyTorch) on the same shapes")
    ap.add_argument("--out", help="append one JSON line per shape to this file")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="config override for zoo's side, repeatable (e.g. model.attention_impl=xla, model.remat=true)")
    a = ap.parse_args(argv)
    try:
        specs = bench_shapes.specs(a.workload or list(bench_shapes.WORKLOADS), a.shapes, preset=a.preset,
                                   seq_len=a.seq_len, batch=a.batch, dtype=a.dtype)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = []
    for spec in specs:
        spec["overrides"] = spec.get("overrides", []) + a.set
        t = time.perf_counter()
        try:
            row = run_spec(spec, a.peer, a.rounds)
        except RuntimeError as e:  # zoo's worker refused the spec (bad --set) or died: one line, no traceback
            print(f"error: {spec['workload']} {spec['name']}: {e}", file=sys.stderr)
            return 2
        row["bench_wall_s"] = time.perf_counter() - t
        rows.append(row)
        print(json.dumps(row), flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
