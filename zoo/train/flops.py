"""Peak FLOP/s per device for MFU: a table for accelerators, a measured matmul rate on CPU."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

# Dense bf16 peak FLOP/s per chip (vendor datasheets; no sparsity).
PEAK_BF16 = {
    "TPU v4": 275e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12, "TPU v5p": 459e12, "TPU v5": 459e12,
    "TPU v6 lite": 918e12, "TPU v6e": 918e12,
    "A100": 312e12, "H100": 989e12, "H200": 989e12,
}

_measured: dict = {}


def cpu_matmul_rate(n: int = 1024, reps: int = 5) -> float:
    """float32 matmul FLOP/s of this host, measured once per process (the CPU 'peak')."""
    if "cpu" not in _measured:
        dev = jax.devices("cpu")[0]
        a = jax.device_put(jnp.ones((n, n), jnp.float32), dev)
        f = jax.jit(lambda x: x @ x)
        f(a).block_until_ready()
        best = float("inf")
        for _ in range(reps):
            t = time.perf_counter()
            f(a).block_until_ready()
            best = min(best, time.perf_counter() - t)
        _measured["cpu"] = 2 * n ** 3 / best
    return _measured["cpu"]


def device_peak(device=None) -> tuple[float, str]:
    """(peak FLOP/s of one device, how it was obtained)."""
    device = device or jax.devices()[0]
    if device.platform == "cpu":
        # Emulated CPU devices share the host's cores: the host rate is the peak of them all together.
        return cpu_matmul_rate(), "cpu float32 matmul, measured"
    kind = device.device_kind
    for name, peak in PEAK_BF16.items():
        if name.lower() in kind.lower():
            return peak, f"{name} bf16 dense (table)"
    return float("nan"), f"unknown device kind {kind!r}"


def total_peak(devices=None) -> float:
    devices = devices or jax.devices()
    peak, _ = device_peak(devices[0])
    return peak if devices[0].platform == "cpu" else peak * len(devices)
