"""What the benchmark parent and the framework workers share: the round length, the statistics, and the
memory bandwidth of known GPUs (for the decoding bound)."""

from __future__ import annotations

import time

from zoo.train.memory import rss_mb  # noqa: F401 (the torch peer's peak memory)

ROUND_SECONDS = 0.5  # a round repeats the step until it lasts about this long


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


# HBM bandwidth in bytes/s by device kind (jax's `device_kind`, torch's device name): the vendors' figures
# for the SXM parts (H100 PCIe: HBM2e), the first key found in the name wins.
HBM_BANDWIDTH = {"H100 PCIe": 2.0e12, "H100": 3.35e12, "H200": 4.8e12, "A100": 2.0e12}


def hbm_bandwidth(device_kind: str) -> float | None:
    """Memory bandwidth of a known GPU ("NVIDIA H100 80GB HBM3" -> 3.35e12), None for others and CPUs."""
    for key, bw in HBM_BANDWIDTH.items():
        if key.lower() in (device_kind or "").lower():
            return bw
    return None
