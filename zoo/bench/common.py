"""What the benchmark parent and both framework workers share: the round length and the statistics."""

from __future__ import annotations

import resource
import time

ROUND_SECONDS = 0.5  # a round repeats the step until it lasts about this long


def rss_mb() -> float:
    """Peak resident memory of this process (the CPU's "peak memory")."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else 0.5 * (xs[len(xs) // 2 - 1] + xs[len(xs) // 2])


def calibrate(run_steps) -> tuple[float, int]:
    """Time one call of run_steps(1) (it compiles), then run_steps(2): (compile seconds, steps per round
    of about ROUND_SECONDS)."""
    t = time.perf_counter()
    run_steps(1)
    compile_s = time.perf_counter() - t
    t = time.perf_counter()
    run_steps(2)
    return compile_s, max(1, int(ROUND_SECONDS / ((time.perf_counter() - t) / 2)))
