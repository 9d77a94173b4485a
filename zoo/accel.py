"""XLA flags for NVIDIA GPUs, set by zoo's entry points before jax starts its backend.

`configure()` is called first thing by train.py / zoo-train and by each benchmark worker. When an
NVIDIA GPU is the target (decided without importing jax, see `gpu_target`), it appends `GPU_FLAGS`
to the `XLA_FLAGS` environment variable: the user's own string is kept as it is and comes first, and
a flag whose name the user already set (to any value, or negated with --no...) is not added again.
XLA reads `XLA_FLAGS` once, when the backend starts (the first device query or computation), so this
must run before that, not necessarily before `import jax`. `ZOO_XLA_GPU_FLAGS=0` turns it off (to
measure without the flags); XLA aborts on a flag it does not know, so each one here is checked to
parse by tests/bench/test_accel.py against the installed jaxlib.

The flags, conservative and documented, measured on an H200 (2026-11-27, jax 0.11.2: GPT-2 124M at T=1024,
B=16 trained at 463k tokens/s with them and 380k with `ZOO_XLA_GPU_FLAGS=0`, docs/bench/); re-measure with
`zoo-bench --shapes gpu` against `ZOO_XLA_GPU_FLAGS=0`:

- `--xla_gpu_enable_latency_hiding_scheduler=true`: schedules independent work (collectives, async
  copies) to overlap compute. Recommended by JAX's "GPU performance tips", baked into NVIDIA's
  JAX-Toolbox images, and set by MaxText's GPU recipes (end_to_end/gpu/a3/test_llama2_7b.sh). No-op
  cost on one GPU; the win is multi-GPU data/tensor parallelism.
- `--xla_gpu_enable_triton_gemm=false`: GEMMs go to cuBLAS(Lt) instead of XLA's Triton emitter, as
  in MaxText's GPU recipes: cuBLAS is the faster kernel for the large bf16 transformer GEMMs on
  A100/H100, and skipping Triton's GEMM autotuning cuts compile time.

Considered and left at XLA's default: command buffers (CUDA graphs, `--xla_gpu_enable_command_buffer`)
are already on by default for fusions, cuBLAS and cuDNN calls, which is what a one-GPU step wants
(MaxText's `--xla_gpu_graph_level=0` turned them off for multi-GPU runs; that flag no longer exists
and would abort XLA); the collective-combining and pipelining flags matter only across GPUs.
"""

from __future__ import annotations

import os

GPU_FLAGS = (
    "--xla_gpu_enable_latency_hiding_scheduler=true",
    "--xla_gpu_enable_triton_gemm=false",
)
OFF_ENV = "ZOO_XLA_GPU_FLAGS"  # "0", "false", "off" or "no": add nothing


def flag_name(token: str) -> str | None:
    """The flag a command-line token sets: "--xla_x=1" -> "xla_x", "--noxla_x" -> "xla_x"; None for a value."""
    if not token.startswith("-"):
        return None
    name = token.lstrip("-").split("=", 1)[0]
    return name[2:] if name.startswith("noxla_") else name


def merge_flags(user: str, ours) -> str:
    """`user` followed by each flag of `ours` whose name it does not set already."""
    taken = {flag_name(t) for t in user.split()}
    extra = [f for f in ours if flag_name(f) not in taken]
    return " ".join(([user.strip()] if user.strip() else []) + extra)


def gpu_target(platform_hint: str | None = None, env=None) -> bool:
    """Whether jax will run on an NVIDIA GPU, judged without importing jax: the hint ("gpu", "cuda" or
    another platform) if given; else JAX_PLATFORMS (or JAX_PLATFORM_NAME) if set; else no when
    CUDA_VISIBLE_DEVICES hides every device; else whether the NVIDIA driver shows a device."""
    env = os.environ if env is None else env
    if platform_hint:
        return platform_hint.lower() in ("gpu", "cuda")
    platforms = env.get("JAX_PLATFORMS") or env.get("JAX_PLATFORM_NAME")
    if platforms:
        first = platforms.split(",")[0].strip().lower()
        return first in ("gpu", "cuda")
    if env.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return _nvidia_device_present()


def _nvidia_device_present() -> bool:
    if os.path.exists("/dev/nvidia0"):
        return True
    try:
        return bool(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return False


def configure(platform_hint: str | None = None, env=None) -> list[str]:
    """Append GPU_FLAGS to env["XLA_FLAGS"] (default os.environ) when an NVIDIA GPU is the target; the
    flags added (none when the target is not a GPU, when OFF_ENV says so, or when the user set them)."""
    env = os.environ if env is None else env
    if env.get(OFF_ENV, "").strip().lower() in ("0", "false", "off", "no") or not gpu_target(platform_hint, env):
        return []
    user = env.get("XLA_FLAGS", "")
    merged = merge_flags(user, GPU_FLAGS)
    added = merged[len(user.strip()):].split()
    if added:
        env["XLA_FLAGS"] = merged
    return added
