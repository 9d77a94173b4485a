"""Peak memory, as training runs and the benchmark report it: the largest `peak_bytes_in_use` among this
process's devices where the backend counts it (GPU, TPU), else the process's peak resident memory (CPU:
params, optimizer state and activations live in host memory, beside jax, XLA and the libraries)."""

from __future__ import annotations

import resource


def rss_mb() -> float:
    """Peak resident memory of this process, MB (ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_memory_mb(devices) -> float:
    peaks = []
    for d in devices:
        try:
            stats = d.memory_stats() if d.platform != "cpu" else None
        except Exception:  # noqa: BLE001 - a backend without memory stats
            stats = None
        if stats and "peak_bytes_in_use" in stats:
            peaks.append(stats["peak_bytes_in_use"] / 2**20)
    return max(peaks) if peaks else rss_mb()
