"""The benchmark parent: start one worker process per framework, alternate timed rounds between zoo and each
peer so that both see the same machine conditions, and summarise medians, minima and zoo / peer ratios.

zoo's worker stays up for a whole shape; the peers run one after the other beside it (each pairing: warm-up
rounds, then alternating timed rounds; a peer's process ends before the next one starts, so at most two
processes hold device memory, and zoo's jax does not preallocate the GPU when a peer shares it). On a GPU
the peers' processes start with zoo's, so that their imports overlap zoo's compile; on CPU they start
when their turn comes, as their imports would otherwise slow zoo's compile.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys

from zoo import accel
from zoo.bench import shapes as bench_shapes
from zoo.bench.common import median

ROUNDS, WARMUP = 5, 2
RATIO_KEYS = ("tokens_per_s", "decode_tokens_per_s", "sequences_per_s")


class Worker:
    """A `python -m zoo.bench.worker FRAMEWORK` process answering one JSON line per request. With `hold` it
    imports its framework and waits; `go()` lets it set up."""

    def __init__(self, framework: str, spec: dict, hold: bool = False, env: dict | None = None):
        self.framework = framework
        args = [sys.executable, "-m", "zoo.bench.worker", framework, json.dumps(spec)] + (["--hold"] if hold else [])
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})})
        self.rounds = 0  # rounds asked so far: `final N` summarises the rounds from the N-th on
        self.ready = None if hold else self._read()  # setup + compile + warm-up report

    def go(self) -> dict:
        try:
            self.proc.stdin.write("go\n")
            self.proc.stdin.flush()
        except OSError:  # it has ended already (its import failed): _read reports why
            pass
        self.ready = self._read()
        return self.ready

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
        self.rounds += what == "round"
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _timed_rounds(workers: dict, rounds: int) -> dict:
    """WARMUP rounds each, then `rounds` alternating rounds: {name: [round report, ...]} of the timed ones."""
    times = {k: [] for k in workers}
    for _ in range(WARMUP):
        for w in workers.values():
            w.ask("round")
    for _ in range(rounds):
        for k, w in workers.items():  # alternate: each round of zoo is followed by one of the peer
            times[k].append(w.ask("round"))
    return times


def run_spec(spec: dict, peers, rounds: int, profile: str | None = None, env: dict | None = None) -> dict:
    """One shape: zoo beside each peer in turn (peers: a list of names, one name, or None); a summarised row.
    With `profile`, a jax.profiler trace of a few zoo steps goes to PROFILE/WORKLOAD-SHAPE. `env`: more of
    zoo's worker's environment (a multi-process run's, zoo.cli.bench.several_processes)."""
    peers = [peers] if isinstance(peers, str) else list(peers or [])
    peers = peers if spec["workload"] in bench_shapes.PEER_WORKLOADS else []
    gpu = accel.gpu_target()
    early = {p: Worker(p, spec, hold=True) for p in peers} if gpu else {}  # imports overlap zoo's compile
    shared = {"XLA_PYTHON_CLIENT_PREALLOCATE": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "false")}
    zoo = Worker("zoo", spec, env={**(shared if gpu and peers else {}), **(env or {})})  # jax leaves the peers GPU memory
    zoo_rounds, pairs, first = [], {}, None
    try:
        for name in peers:
            w = early.pop(name, None)
            try:
                w = w or Worker(name, spec, hold=True)
                w.go()
            except RuntimeError as e:
                print(f"peer {name} skipped for {spec['workload']}: {e}", file=sys.stderr)
                if w:
                    w.close()
                continue
            start = zoo.rounds + WARMUP  # zoo's timed rounds beside this peer: from there on
            first = start if first is None else first
            times = _timed_rounds({"zoo": zoo, name: w}, rounds)
            zoo_rounds += times["zoo"]
            pairs[name] = (w.ready, times[name], w.ask(f"final {WARMUP}"), zoo.ask(f"final {start}"))
            w.close()
        if not pairs:  # no peer asked, or none could run: zoo alone
            first = zoo.rounds + WARMUP
            zoo_rounds = _timed_rounds({"zoo": zoo}, rounds)["zoo"]
        final = zoo.ask(f"final {first}")  # the timed rounds (and any later peer's warm-up), not the first warm-up
        if profile:
            path = os.path.join(profile, f"{spec['workload']}-{spec['name']}")
            zoo.ask(f"profile {os.path.abspath(path)}")
            final["profile"] = path
    finally:
        zoo.close()
        for w in early.values():
            w.close()
    return summarise(spec, (zoo.ready, zoo_rounds, final), pairs)


def summarise(spec: dict, zoo: tuple, peers: dict | None = None) -> dict:
    """The row of one shape. zoo = (ready, timed rounds, final); peers = {name: (ready, timed rounds, final,
    zoo's final over the rounds alternated with that peer)}. Each peer's ratios are zoo / peer over the
    rounds they alternated; with a single peer they are also top-level `ratio_*` keys."""
    ready, rounds, final = zoo
    kept = ("device_kind", "device_count", "process_count", "process_index", "compile_s", "peak_flops", "settings",
            "trainable_params")
    row = {"workload": spec["workload"], "shape": spec["name"], **{k: ready[k] for k in kept if k in ready}}
    row["card"] = ready.get("device_kind")
    row["dtype"] = ready.get("settings", {}).get("dtype")
    row.update({k: ready[k] for k in ("zoo", "xla_flags", "attention_fallbacks") if k in ready})
    row["date"] = datetime.date.today().isoformat()
    for key in rounds[0] if rounds else ():
        if key.endswith("_s"):  # per-round durations: median and min
            row[f"{key}_median"] = median([r[key] for r in rounds])
            row[f"{key}_min"] = min(r[key] for r in rounds)
        else:  # per-round fractions (input wait): the median
            row[key] = median([r[key] for r in rounds])
    row.update(final)
    if peers:
        row["peers"] = {}
        for name, (p_ready, p_rounds, p_final, zoo_final) in peers.items():
            peer = {**{k: v for k, v in p_ready.items() if k != "name"}, **p_final}
            for key in p_rounds[0]:
                peer[f"{key}_median"] = median([r[key] for r in p_rounds])
            for key in RATIO_KEYS:
                if key in zoo_final and peer.get(key):
                    peer[f"ratio_{key}"] = zoo_final[key] / peer[key]
            if peer.get("device") != row["card"] and not (peer.get("device") == "cpu" == str(row["card"]).lower()):
                print(f"warning: {spec['workload']} {spec['name']}: zoo ran on {row['card']}, {name} on "
                      f"{peer.get('device')}", file=sys.stderr)
            row["peers"][name] = peer
        if len(peers) == 1:
            (peer,) = row["peers"].values()
            row.update({k: v for k, v in peer.items() if k.startswith("ratio_")})
    return row


def table(rows: list[dict]) -> str:
    """A markdown table of the rows: zoo's numbers, then zoo / peer (tokens/s; decode tokens/s for
    generate) for each peer that ran. real_tokens_per_s (sft: the positions that hold a token) where rows
    have it, so packed and padded rows compare on it; step_memory_mb (XLA's count for the train step), on
    which full training and LoRA compare; score_vs_forward (eval_score: scoring tokens/s over the forward
    pass's at the same shape)."""
    cols = ["workload", "shape", "card", "dtype", "tokens_per_s", "real_tokens_per_s", "score_vs_forward", "mfu",
            "step_s_median", "input_wait_frac", "compile_s", "peak_memory_mb", "step_memory_mb", "decode_bound_frac"]
    cols = [c for c in cols if any(c in r for r in rows)]
    peer_names = list(dict.fromkeys(n for r in rows for n in r.get("peers", {})))
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else ("" if v is None else str(v))
    lines = [" | ".join(cols + [f"zoo / {n}" for n in peer_names]),
             " | ".join("---" for _ in cols + peer_names)]
    for r in rows:
        ratios = [r.get("peers", {}).get(n, {}).get("ratio_tokens_per_s") for n in peer_names]
        lines.append(" | ".join([fmt(r.get(c)) for c in cols] + [fmt(x) for x in ratios]))
    return "\n".join(lines)
