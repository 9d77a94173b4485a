"""Where a profiled step's time goes: per-op totals of a `jax.profiler` trace (`zoo-bench --profile DIR`),
read with jax's own `jax.profiler.ProfileData`, so no TensorBoard or xprof is needed.

    python -m zoo.bench.profile_summary DIR [--top 40] [--json OUT]

For each device plane (`/device:GPU:0`...) and each of its lines (on an H200 with jax 0.11: one line per
CUDA stream, its events the kernels: cuBLAS `nvjet_*`, cuDNN `*sdpa*`, XLA's fusions by HLO name), the ops that took most time, summed
over every event of the trace: total milliseconds, the share of the line's total, and the count. On a CPU,
which has no device plane, the host's XLA threads stand in.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from collections import defaultdict


def trace_files(path: str) -> list[str]:
    """The .xplane.pb files under `path` (a file itself, or a --profile folder at any depth)."""
    if os.path.isfile(path):
        return [path]
    return sorted(glob.glob(os.path.join(path, "**", "*.xplane.pb"), recursive=True))


def summarise(path: str) -> list[dict]:
    """[{plane, line, total_ms, ops: [{name, ms, frac, count}, ...] (longest first)}, ...] for every line
    with events of every device plane in the trace files under `path` (host XLA threads on a CPU)."""
    from jax.profiler import ProfileData
    files = trace_files(path)
    if not files:
        raise FileNotFoundError(f"no .xplane.pb trace under {path}")
    lines = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))  # (plane, line) -> name -> [ns, count]
    for f in files:
        data = ProfileData.from_file(f)
        planes = list(data.planes)
        # a device plane with no events (libtpu adds an empty "/device:CUSTOM:Megascale Trace" on a CPU host)
        # is no device: the host's XLA threads stand in then
        device = [p for p in planes if p.name.startswith("/device:") and any(len(list(ln.events)) for ln in p.lines)]
        for plane in device or [p for p in planes if p.name == "/host:CPU"]:
            for line in plane.lines:
                if not device and "XLA" not in line.name:  # CPU: the XLA threads, not python's
                    continue
                for ev in line.events:
                    acc = lines[(plane.name, line.name)][ev.name]
                    acc[0] += ev.duration_ns
                    acc[1] += 1
    out = []
    for (plane, line), ops in lines.items():
        total = sum(ns for ns, _ in ops.values())
        rows = sorted(ops.items(), key=lambda kv: -kv[1][0])
        out.append({"plane": plane, "line": line, "total_ms": total / 1e6,
                    "ops": [{"name": n, "ms": ns / 1e6, "frac": ns / total if total else 0.0, "count": c}
                            for n, (ns, c) in rows]})
    return sorted(out, key=lambda r: (r["plane"], -r["total_ms"]))


def render(summary: list[dict], top: int = 40) -> str:
    """A text table per line: its total, then its `top` ops."""
    parts = []
    for r in summary:
        parts.append(f"## {r['plane']} · {r['line']} · {r['total_ms']:.2f} ms in {len(r['ops'])} ops")
        for op in r["ops"][:top]:
            parts.append(f"{op['ms']:10.3f} ms {100 * op['frac']:5.1f}% {op['count']:6d}x  {op['name'][:160]}")
    return "\n".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zoo.bench.profile_summary", description=__doc__.split("\n")[0])
    ap.add_argument("path", help="a trace folder (zoo-bench --profile DIR, or one shape's folder in it) or file")
    ap.add_argument("--top", type=int, default=40, help="ops listed per line (default: %(default)s)")
    ap.add_argument("--json", help="also write the whole summary (every op) to this JSON file")
    a = ap.parse_args(argv)
    try:
        summary = summarise(a.path)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(render(summary, a.top))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
