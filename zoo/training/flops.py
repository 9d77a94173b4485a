"""Peak FLOP/s per device for MFU: a table for accelerators, a measured-once matmul rate on CPU.

Accelerators: the vendor's dense bf16 peak per chip (PEAK_BF16), times the number of chips.

CPU: the peak is the larger of two numbers, so that no MFU exceeds what a plain matmul reaches on the host:

- what the machine is (`hardware_peak`): cores x float32 FLOP per cycle per core x clock, from /proc/cpuinfo:
  the cores this process may use, 2 FMA units x the vector width (AVX-512: 16 float32 lanes, AVX2/AVX: 8,
  SSE or NEON: 4) x 2 FLOP per FMA, and the clock (cpufreq's maximum where the kernel shows it, else "cpu MHz").
  On this project's 2-core AMD EPYC: 2 x 64 x 2.6 GHz = 332 GFLOP/s. It does not depend on how busy the machine
  is when measured, which a cached measurement did: a run on a loaded host had divided by a low matmul rate and
  reported MFU 0.89;
- the best float32 matmul rate measured on the host (below), in case the table above underestimates a CPU.

The measurement:

- the benchmark is a float32 matmul on the first CPU device, at several sizes (512, 1024, 2048), each
  repeated for about half a second; the peak is the best single repetition over all of them. A best-of
  over many short runs is an upper bound on what XLA's CPU matmul reaches on this host, and a training
  step (matmuls plus everything else) cannot beat it, so MFU stays below 1;
- the result is written to ~/.cache/zoo/cpu_peak.json (``$ZOO_CACHE_DIR`` or ``$XDG_CACHE_HOME/zoo``
  instead of ~/.cache/zoo when set), keyed by CPU model, core count and jax/jaxlib versions, so two
  identical runs on one machine divide by the same number. A missing, unreadable or corrupt cache is
  measured again (and rewritten if the directory is writable); it never stops training;
- ``ZOO_CPU_PEAK_FLOPS=<FLOP/s>`` fixes the peak instead (no measurement, no cache). Delete the cache
  file to measure again, e.g. after a benchmark that ran while the machine was busy.

Emulated CPU devices (--xla_force_host_platform_device_count) share the host's cores, so the CPU peak
is that of the host, however many devices a run uses.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time

import jax
import jax.numpy as jnp

# Dense bf16 peak FLOP/s per chip (vendor datasheets; no sparsity).
PEAK_BF16 = {
    "TPU v4": 275e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12, "TPU v5p": 459e12, "TPU v5": 459e12,
    "TPU v6 lite": 918e12, "TPU v6e": 918e12,
    "A100": 312e12, "H100": 989e12, "H200": 989e12,
}

BENCH_SIZES = (512, 1024, 2048)
BENCH_SECONDS = 0.5  # per size
ENV_PEAK = "ZOO_CPU_PEAK_FLOPS"

_measured: dict = {}


def cache_path() -> str:
    from zoo.runtime import cache_root
    return os.path.join(cache_root(), "cpu_peak.json")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def _core_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def host_key() -> str:
    """What the cached peak is valid for: CPU model, cores this process may use, jax and jaxlib."""
    import jaxlib
    return (f"{_cpu_model()} | {_core_count()} cores | jax {jax.__version__} | "
            f"jaxlib {getattr(jaxlib, '__version__', '?')}")


def measure_cpu_matmul_peak(sizes=BENCH_SIZES, seconds: float = BENCH_SECONDS) -> float:
    """Best float32 matmul FLOP/s of this host over `sizes`, each repeated for about `seconds` (at least 3
    times): the benchmark behind the cached CPU peak."""
    dev = jax.devices("cpu")[0]
    f = jax.jit(lambda x, y: x @ y)
    best = 0.0
    for n in sizes:
        a = jax.device_put(jnp.ones((n, n), jnp.float32), dev)
        b = jax.device_put(jnp.full((n, n), 0.5, jnp.float32), dev)
        f(a, b).block_until_ready()  # compile
        t_end, reps = time.perf_counter() + seconds, 0
        while reps < 3 or time.perf_counter() < t_end:
            t = time.perf_counter()
            f(a, b).block_until_ready()
            best = max(best, 2 * n ** 3 / (time.perf_counter() - t))
            reps += 1
    return best


def _read_cache(path: str, key: str) -> float | None:
    try:
        with open(path) as f:
            value = json.load(f)[key]["flops"]
        value = float(value)
        return value if math.isfinite(value) and value > 0 else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _write_cache(path: str, key: str, value: float) -> None:
    """Add `key` to the cache file atomically; a failure (read-only home, ...) only costs a re-measurement."""
    try:
        try:
            with open(path) as f:
                table = json.load(f)
            table = table if isinstance(table, dict) else {}
        except (OSError, ValueError):
            table = {}
        table[key] = {"flops": value, "measured": time.strftime("%Y-%m-%d %H:%M:%S"),
                      "sizes": list(BENCH_SIZES)}
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(table, f, indent=1)
        os.replace(tmp, path)
    except OSError:
        pass


def _cpuinfo() -> dict:
    """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
    out = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    if out:
                        break
                    continue
                k, _, v = line.partition(":")
                out[k.strip().lower()] = v.strip()
    except OSError:
        pass
    return out


def _max_mhz() -> float | None:
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq") as f:
            return int(f.read().strip()) / 1000.0
    except (OSError, ValueError):
        return None


def hardware_peak(info: dict | None = None, cores: int | None = None, max_mhz: float | None = None) -> float | None:
    """Cores x float32 FLOP per cycle x clock of this CPU (None where /proc/cpuinfo says too little): 2 FMA units
    per core x the widest vector unit's float32 lanes x 2 FLOP per FMA."""
    info = _cpuinfo() if info is None else info
    flags = set((info.get("flags") or info.get("features") or "").split())
    lanes = 16 if "avx512f" in flags else 8 if flags & {"avx2", "avx"} else 4 if flags & {"sse2", "asimd", "neon"} \
        else None
    mhz = max_mhz if max_mhz is not None else _max_mhz()
    try:
        mhz = mhz or float(info.get("cpu mhz", "nan"))
    except ValueError:
        return None
    if lanes is None or not math.isfinite(mhz) or mhz <= 0:
        return None
    return (cores or _core_count()) * 2 * lanes * 2 * mhz * 1e6


def cpu_peak() -> tuple[float, str]:
    """(the host's peak float32 FLOP/s, where it came from): $ZOO_CPU_PEAK_FLOPS, else the larger of the hardware's
    (hardware_peak) and the best matmul rate (the cache, or measured now and cached). Looked up once per
    process."""
    if "cpu" not in _measured:
        _measured["cpu"] = _cpu_peak()
    return _measured["cpu"]


def _cpu_peak() -> tuple[float, str]:
    matmul, how = _matmul()
    hw = hardware_peak()
    if hw is not None and hw > matmul and "fixed by" not in how:
        return hw, f"cpu float32, cores x FMA lanes x clock (above the {matmul / 1e9:.0f} GFLOP/s matmul, {how})"
    return matmul, how


def _matmul_peak() -> tuple[float, str]:
    """(the host's float32 matmul peak FLOP/s, where it came from): $ZOO_CPU_PEAK_FLOPS, the cache, or a
    measurement (then cached)."""
    env = os.environ.get(ENV_PEAK)
    if env:
        try:
            value = float(env)
        except ValueError:
            value = None
        if value is not None and math.isfinite(value) and value > 0:
            return value, f"cpu float32 matmul, fixed by ${ENV_PEAK}"
    path, key = cache_path(), host_key()
    value = _read_cache(path, key)
    if value is not None:
        return value, f"cpu float32 matmul, measured once ({path})"
    value = measure_cpu_matmul_peak()
    _write_cache(path, key, value)
    return value, "cpu float32 matmul, measured now"


def _matmul() -> tuple[float, str]:
    if "matmul" not in _measured:
        _measured["matmul"] = _matmul_peak()
    return _measured["matmul"]


def cpu_matmul_rate() -> float:
    """The best float32 matmul FLOP/s of this host ($ZOO_CPU_PEAK_FLOPS, cached, or measured)."""
    return _matmul()[0]


def device_peak(device=None) -> tuple[float, str]:
    """(peak FLOP/s of one device, how it was obtained)."""
    device = device or jax.devices()[0]
    if device.platform == "cpu":
        # Emulated CPU devices share the host's cores: the host rate is the peak of them all together.
        return cpu_peak()
    kind = device.device_kind
    for name, peak in PEAK_BF16.items():
        if name.lower() in kind.lower():
            return peak, f"{name} bf16 dense (table)"
    return float("nan"), f"unknown device kind {kind!r}"


def total_peak(devices=None) -> float:
    devices = devices or jax.devices()
    peak, _ = device_peak(devices[0])
    return peak if devices[0].platform == "cpu" else peak * len(devices)
