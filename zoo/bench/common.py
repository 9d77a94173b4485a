"""What the benchmark parent and the framework workers share: the round length, the statistics, and the
memory bandwidth of known GPUs (for the decoding bound)."""

from __future__ import annotations

import time

from zoo.training.memory import rss_mb  # noqa: F401 (the torch peer's peak memory)

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


def measured_bandwidth(megabytes: int = 512, repeats: int = 5) -> float:
    """This machine's memory bandwidth as zoo measures it where no vendor figure applies (a CPU): the bytes a
    jitted sum over a float32 array of `megabytes` (far beyond any cache) reads per second, best of `repeats`."""
    import jax
    import jax.numpy as jnp
    x = jnp.ones((megabytes << 18,), jnp.float32)
    total = jax.jit(jnp.sum)
    total(x).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        total(x).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return x.nbytes / best


BANDWIDTH_METHOD = {"vendor": "the vendor's HBM figure for the card",
                    "measured": "measured: a jitted float32 sum over 512 MB, best of 5 (zoo.bench.common)"}


def grpo_final(times, rows: int, train_tokens: float, extra: dict) -> dict:
    """grpo_train's throughput from its rounds (zoo's and the peer's): per step `step_s`, `complete_s` (sampling),
    `score_s` (the reward), `completion_tokens` (sampled); zoo's also the two samplers timed alone."""
    med = lambda key: median([r[key] for r in times])  # noqa: E731
    step, tokens = med("step_s"), med("completion_tokens")
    out = {"tokens_per_s": tokens / step, "train_tokens_per_s": train_tokens / step, "sequences_per_s": rows / step,
           "decode_tokens_per_s": tokens / med("complete_s"), "completion_tokens_per_step": tokens,
           "train_tokens_per_step": train_tokens, "gen_frac": med("complete_s") / step,
           "reward_frac": med("score_s") / step, "mfu": None, **extra}
    if "in_loop_sample_s" in times[0]:
        out.update(in_loop_tokens_per_s=tokens / med("in_loop_sample_s"),
                   load_generate_tokens_per_s=tokens / med("load_generate_s"),
                   in_loop_vs_load_generate=med("load_generate_s") / med("in_loop_sample_s"))
    return out


def timed_round(bench) -> dict:
    """One round of `bench`: `bench.k` steps, their mean time `step_s` and the mean of each phase the steps added to
    `bench.spent` (seconds by name)."""
    import time
    bench.spent = {}
    t = time.perf_counter()
    bench._steps(bench.k)
    dt = (time.perf_counter() - t) / bench.k
    return {"step_s": dt, **{k: v / bench.k for k, v in bench.spent.items()}}
