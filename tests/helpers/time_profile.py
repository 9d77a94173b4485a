"""Where a test's time goes, written when ZOO_TEST_PROFILE names a file: one JSON line per test phase
(setup, call, teardown) with its wall seconds, the xdist worker and when it ended (epoch seconds), the seconds
XLA spent compiling in this process, how many programs it compiled, how many came from the persistent cache,
the seconds of Python's cyclic garbage collection, the wall seconds of the processes the test started (CLI runs,
multi-process runs), and each program compiled (not loaded from the cache) in 0.05 s or more: [name, seconds,
persistent-cache key]. `python -m tests.helpers.time_profile FILE` sums them up per module and per kind."""

import collections
import gc
import json
import logging
import os
import subprocess
import sys
import time

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
_totals = collections.Counter()
_programs = []  # [name, seconds, key] of this phase's compiles that missed the persistent cache
_missed = []  # the cache key of the compile in progress, when the cache missed it
_gc_started = [0.0]


def _on_duration(event, seconds, fun_name="", **_):
    if event == COMPILE_EVENT:
        _totals["compile_s"] += seconds
        _totals["compiles"] += 1
        if _missed and seconds >= 0.05:
            _programs.append([fun_name, round(seconds, 3), _missed[-1]])
        _missed.clear()


class _MissLog(logging.Handler):
    """jax's compiler logs each persistent-cache miss with its key (at DEBUG)."""

    def emit(self, record):
        if record.msg.startswith("PERSISTENT COMPILATION CACHE MISS"):
            _missed.append(record.args[1][-16:])


def _on_gc(phase, info):
    if phase == "start":
        _gc_started[0] = time.perf_counter()
    else:
        _totals["gc_s"] += time.perf_counter() - _gc_started[0]


def _on_event(event, **_):
    if event == CACHE_HIT_EVENT:
        _totals["cache_hits"] += 1


class _TimedPopen(subprocess.Popen):
    """Popen that adds each child's lifetime (start to reaped) to the totals."""

    def __init__(self, *args, **kw):
        self._zoo_started = time.perf_counter()
        self._zoo_counted = False
        super().__init__(*args, **kw)

    def _zoo_count(self):
        if not self._zoo_counted and self.returncode is not None:
            self._zoo_counted = True
            _totals["subprocess_s"] += time.perf_counter() - self._zoo_started

    def wait(self, *args, **kw):
        try:
            return super().wait(*args, **kw)
        finally:
            self._zoo_count()

    def poll(self):
        try:
            return super().poll()
        finally:
            self._zoo_count()


def install():
    """Start counting (the listeners and the Popen wrapper); returns the output path, or None when off."""
    path = os.environ.get("ZOO_TEST_PROFILE")
    if not path:
        return None
    from jax import monitoring
    monitoring.register_event_duration_secs_listener(_on_duration)
    monitoring.register_event_listener(_on_event)
    compiler_log = logging.getLogger("jax._src.compiler")
    compiler_log.setLevel(logging.DEBUG)
    compiler_log.addHandler(_MissLog(logging.DEBUG))
    gc.callbacks.append(_on_gc)
    subprocess.Popen = _TimedPopen
    return path


def record(path, report):
    """Append one phase's line and reset the counters."""
    line = {"test": report.nodeid, "phase": report.when, "wall_s": round(report.duration, 3),
            **{k: round(v, 3) for k, v in _totals.items()}, **({"programs": list(_programs)} if _programs else {}),
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "ended": round(report.stop, 1)}
    _totals.clear(), _programs.clear()
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def summary(path, top=25):
    """Totals per module (wall, compile, subprocess seconds), and the slowest phases."""
    rows = [json.loads(line) for line in open(path)]
    per = collections.defaultdict(collections.Counter)
    kinds = ("wall_s", "compile_s", "subprocess_s", "compiles", "gc_s")
    for r in rows:
        per[r["test"].split("::")[0]].update({k: r.get(k, 0) for k in kinds})
    total = collections.Counter()
    for c in per.values():
        total.update(c)
    out = [f"{'module':58s} {'wall s':>8s} {'compile s':>9s} {'subproc s':>9s} {'compiles':>8s} {'gc s':>6s}"]
    for name, c in sorted(per.items(), key=lambda kv: -kv[1]["wall_s"])[:top]:
        out.append(f"{name:58s} {c['wall_s']:8.1f} {c['compile_s']:9.1f} {c['subprocess_s']:9.1f} {c['compiles']:8d} "
                   f"{c['gc_s']:6.1f}")
    out.append(f"{'all ' + str(len(per)) + ' modules':58s} {total['wall_s']:8.1f} {total['compile_s']:9.1f} "
               f"{total['subprocess_s']:9.1f} {total['compiles']:8d} {total['gc_s']:6.1f}")
    return "\n".join(out)


if __name__ == "__main__":
    print(summary(sys.argv[1], *map(int, sys.argv[2:3])))
