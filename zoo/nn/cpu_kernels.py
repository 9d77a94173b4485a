"""zoo's C++ kernels for a decoding step's attention on a CPU, over a page pool or a dense cache
(decode_attention.cc beside this file), built the first time a process asks for them, and their calls from a jitted
program (XLA FFI custom calls).

Why: XLA:CPU reads a row's pages for attention by a gather, each layer copying every row's pages out of the pool,
and over a dense cache it attends by products and sums over every slot the program holds, masking the empty ones.
The kernels read each row's keys and values where they lie, up to the row's length, each block of positions once
(its keys, a running maximum and sum, then its values while the block is in cache), rows spread over the cores
(OpenMP). They serve zoo-serve's engine (a paged cache: zoo.nn.paged_kernels' `decode_step`) and every decoding
step over a dense cache (zoo.infer.sample: generate, zoo-sample, zoo-eval's generation, GRPO's rollouts:
`decode_step` here) on a CPU in float32. Measured by `python -m zoo.bench.cpu_kernel` (both sides in one process,
alternated; SmolLM2-135M's shape; the README's "A C++ attention kernel on the CPU").

Built once per machine: the system's C++ compiler ($CXX, else c++) compiles the source against jaxlib's XLA FFI
headers (jax.ffi.include_dir()) for this CPU (-march=native, OpenMP) into CACHE_ROOT/kernels/ (zoo.runtime),
named by a hash of the source, jaxlib's version, the compiler and this CPU's model and flags, so a home directory
that other machines share keeps one build each. It is written under a temporary name and renamed whole: processes
building at once never load half a file. Where it cannot be built (no compiler, no OpenMP, no headers),
`unavailable()` says why in one line and the engine gathers the pages (`--paged-kernel auto`) or refuses
(`--paged-kernel cpu`).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading

import jax
import jax.numpy as jnp
import numpy as np

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "decode_attention.cc")
TARGETS = {"zoo_paged_decode_f32": "ZooPagedDecodeF32", "zoo_dense_decode_f32": "ZooDenseDecodeF32"}  # call: handler
_REGISTERED: list = []  # the library registered in this process
_LOCK = threading.Lock()
FLAGS = ("-O3", "-march=native", "-fopenmp", "-ffast-math", "-shared", "-fPIC", "-std=c++17", "-w")


class Unavailable(RuntimeError):
    """The kernel could not be built or loaded here (its message says why, in one line)."""


def compiler() -> str:
    return os.environ.get("CXX") or "c++"


def _cpu() -> str:
    """This CPU's model and flags (what -march=native compiles for)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith(("model name", "flags"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor() + platform.machine()


def library_path() -> str:
    """Where this machine's build lies (built or not)."""
    import jaxlib
    from zoo.runtime import cache_root
    with open(SOURCE, "rb") as f:
        key = hashlib.sha256(f.read() + "\0".join([jaxlib.__version__, compiler(), _cpu(), *FLAGS]).encode())
    return os.path.join(cache_root(), "kernels", f"decode_attention-{key.hexdigest()[:16]}.so")


def build(path: str) -> None:
    """Compile the source into `path` (a temporary file beside it, renamed whole)."""
    cxx = shutil.which(compiler())
    if cxx is None:
        raise Unavailable(f"no C++ compiler ({compiler()}; set CXX) to build zoo's CPU attention kernel")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".decode_attention-", suffix=".so", dir=os.path.dirname(path))
    os.close(fd)
    try:
        done = subprocess.run([cxx, *FLAGS, "-I", jax.ffi.include_dir(), SOURCE, "-o", tmp], capture_output=True,
                              text=True, timeout=300)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise Unavailable(f"{compiler()} could not build zoo's CPU attention kernel: {last}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


@functools.cache
def _load() -> str | None:
    """Build (once per machine) and register the kernel; None, or why it cannot run here."""
    with _LOCK:  # the engine's threads trace programs too: one build and one registration
        return _build_and_register()


def _build_and_register() -> str | None:
    try:
        path = library_path()
        if not os.path.isfile(path):
            build(path)
        # OpenMP's threads sleep between calls rather than spin: a spinning one takes a core from XLA's next ops
        # (one row's step 0.8-0.9x as fast beside it, measured by python -m zoo.bench.cpu_kernel). Read once, as the
        # library loads OpenMP; one the user set stays.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        library = ctypes.cdll.LoadLibrary(path)
        handlers = {name: getattr(library, symbol) for name, symbol in TARGETS.items()}
        if not _REGISTERED:  # once a process: jax refuses a second handler under a name
            for name, handler in handlers.items():
                jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(handler), platform="cpu")
            _REGISTERED.append(path)
    except Unavailable as e:
        return str(e)
    except (OSError, subprocess.SubprocessError, AttributeError) as e:  # an unwritable cache, a broken build
        return f"zoo's CPU attention kernel did not build or load ({type(e).__name__}: {e})"
    return None


def unavailable() -> str | None:
    """Why the kernels cannot run here, or None (they are then built and registered). ZOO_CPU_KERNEL=off turns them
    off (XLA's attention everywhere, as before them)."""
    if os.environ.get("ZOO_CPU_KERNEL", "").strip().lower() in ("0", "off", "false", "no"):
        return "ZOO_CPU_KERNEL=off"
    return _load()


def _call(target: str, q_BNH, *args, scale: float, softcap: float):
    why = unavailable()
    if why is not None:
        raise Unavailable(why)
    return jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(q_BNH.shape, q_BNH.dtype), vmap_method="sequential")(
        q_BNH, *args, scale=np.float32(scale), softcap=np.float32(softcap))


def attend(q_BNH, kv_pool, lengths_B, table_BN, *, scale: float, softcap: float = 0.0):
    """One float32 query a row ([B, N, H]) over its first lengths_B[b] positions (at least 1) in its pages
    (table_BN [B, pages]) of the pool [P, PAGE, 2K, H] (key head k at 2k, its value head at 2k + 1): [B, N, H]."""
    return _call("zoo_paged_decode_f32", q_BNH, kv_pool, lengths_B, table_BN, scale=scale, softcap=softcap)


def attend_dense(q_BNH, k_BSKH, v_BSKH, lengths_B, *, scale: float, softcap: float = 0.0):
    """One float32 query a row ([B, N, H]) over its first lengths_B[b] slots (at least 1) of a dense cache of keys and
    one of values ([B, S, K, H] each): [B, N, H]."""
    return _call("zoo_dense_decode_f32", q_BNH, k_BSKH, v_BSKH, lengths_B, scale=scale, softcap=softcap)


def decode_step(attn, q_BTNH, k_BSKH, v_BSKH, positions_T, *, mask=None, bias=None, window: int = 0):
    """Attention module `attn`'s decoding step over its dense cache (zoo.infer.sample's; this step's keys and values
    written already) by the kernel: each row over its slots 0..its position. None where the kernel cannot take the
    step, which XLA's attention then computes: off a CPU, not float32, more than one query a row, a bias, a mask
    beyond the positions, a sliding window, the attention weights asked for, or the kernel unavailable here."""
    from zoo.nn.layers import target_platform
    B, T, N, H = q_BTNH.shape
    K = k_BSKH.shape[2]
    if T != 1 or mask is not None or bias is not None or window or N % K or positions_T is None or \
            attn.is_mutable_collection("intermediates") or target_platform() != "cpu" or \
            {jnp.dtype(x.dtype).name for x in (q_BTNH, k_BSKH, v_BSKH)} != {"float32"} or unavailable() is not None:
        return None
    pos_B = positions_T[:, 0] if positions_T.ndim == 2 else jnp.broadcast_to(positions_T[0], (B,))
    lengths_B = jnp.maximum(pos_B + 1, 1).astype(jnp.int32)  # a padding query (below 0): its first slot, unused
    scale = H ** -0.5 if attn.scale is None else attn.scale
    return attend_dense(q_BTNH[:, 0], k_BSKH, v_BSKH, lengths_B, scale=scale, softcap=attn.softcap)[:, None]
