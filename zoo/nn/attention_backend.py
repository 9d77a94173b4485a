"""The attention backend per platform and shape (split out of zoo.nn.attention, which imports these names, so
callers keep reading them there): `resolve_attention` maps model.attention_impl and the platform to a backend,
`cudnn_unsupported_reason` says why cuDNN flash attention cannot take given shapes and dtypes (jax's own rules and
NVIDIA's support matrix), and `select_backend` decides per call: for `auto`, cuDNN on an NVIDIA GPU and splash
attention on TPU (zoo.nn.tpu_kernels.splash_unsupported_reason) wherever nothing objects, else XLA with the reason
logged once (`note_fallback`; `FALLBACKS` keeps them).
"""

from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp

from zoo.nn.layers import target_platform
from zoo.nn.tpu_kernels import splash_unsupported_reason


# model.attention_impl: einsum is zoo's own softmax attention, what `auto` runs on CPU; xla and cudnn are
# jax.nn.dot_product_attention's backends (cudnn: flash attention on NVIDIA GPUs, what `auto` runs there);
# splash is Pallas's splash attention, what `auto` runs on TPU (elsewhere, named, in Pallas interpret mode).
IMPLEMENTATIONS = ("auto", "xla", "cudnn", "einsum", "splash")
CUDNN_DTYPES = ("bfloat16", "float16")

log = logging.getLogger("zoo.nn.attention")  # the name it logged under before the split (filters, caplog)
FALLBACKS: set[str] = set()  # why `auto` ran XLA instead of cuDNN or splash in this process, each logged once


def resolve_attention(implementation: str | None, platform: str | None = None) -> str:
    """The backend `attention` runs for model.attention_impl on `platform` (default: `target_platform()`, the
    devices of the mesh being traced for, else jax's default backend), before looking at shapes: the named one
    for einsum | xla | cudnn | splash; for auto (or None) einsum on CPU, cudnn on GPU, splash on TPU (XLA
    where `cudnn_unsupported_reason` or `splash_unsupported_reason` objects, see `select_backend`), xla elsewhere."""
    if implementation not in (None, "auto"):
        return implementation
    platform = platform or target_platform()
    return {"cpu": "einsum", "gpu": "cudnn", "cuda": "cudnn", "tpu": "splash"}.get(platform, "xla")


def _capability(cc) -> tuple[int, int] | None:
    try:
        major, minor = str(cc).split(".")
        return int(major), int(minor)
    except ValueError:
        return None


def cudnn_unsupported_reason(q, k, v, bias=None, mask=None, *, is_causal: bool = False, training: bool = True,
                             compute_capability: str | None = None) -> str | None:
    """Why jax.nn.dot_product_attention(implementation="cudnn") cannot take these operands (arrays, tracers or
    jax.ShapeDtypeStruct: only shapes and dtypes are read), or None when it can.

    The conditions, from jax's cuDNN path (jax/_src/cudnn/fused_attention_stablehlo.py: check_layout,
    check_is_flash_attention, combine_bias_and_mask; jax 0.10) and NVIDIA's cuDNN SDPA support matrix
    (docs.nvidia.com/cudnn, "Attention"):

    - query, key and value of one dtype, float16 or bfloat16 (fp8 is a separate API);
    - rank 4, [B, T, N, H] / [B, S, K, H], N a multiple of K (grouped keys are fine), key and value of one
      head dim H: a multiple of 8, at most 128, or 256 on Hopper (compute capability 9.0) and later;
    - a GPU of compute capability 8.0 (Ampere) or later, when `compute_capability` is given (None: not
      checked, and H at most 128);
    - a mask is folded into an additive bias; `attention` broadcasts a mask's length axes to [T, S], so any
      broadcastable boolean mask is fine, but a bias must span [T, S] itself;
    - a bias (or a mask) in training needs even T and S;
    - a bias whose gradient jax's cuDNN rule would not return (`should_export_dbias`: every shape in jax 0.10,
      only [1, N, T, S] in older releases, where the gradient of any other shape came back as zeros).

    `is_causal` needs nothing (cuDNN's causal mask), nor the scale. `training` is False for decoding
    (no gradient is taken), where odd lengths (T = 1) are fine.
    """
    dtypes = {jnp.dtype(x.dtype).name for x in (q, k, v)}
    if len(dtypes) > 1:
        return f"query, key and value dtypes differ ({', '.join(sorted(dtypes))})"
    dtype = dtypes.pop()
    if dtype not in CUDNN_DTYPES:
        return f"dtype {dtype} (cuDNN flash attention takes {' or '.join(CUDNN_DTYPES)})"
    if not len(q.shape) == len(k.shape) == len(v.shape) == 4:
        return "query, key and value must be [batch, length, heads, head dim]"
    B, T, N, H = q.shape
    S, K, Hv = k.shape[1], k.shape[2], v.shape[3]
    if N % K:
        return f"{N} query heads are not a multiple of {K} key/value heads"
    if Hv != H:
        return f"key head dim {H} differs from value head dim {Hv}"
    cc = None if compute_capability is None else _capability(compute_capability)
    if compute_capability is not None and cc is None:
        return f"not an NVIDIA GPU (compute capability {compute_capability!r})"
    if cc is not None and cc < (8, 0):
        return f"compute capability {compute_capability} (cuDNN flash attention needs 8.0, Ampere, or later)"
    h_max = 256 if cc is not None and cc >= (9, 0) else 128
    if H % 8 or H > h_max:
        return f"head dim {H} (cuDNN flash attention takes a multiple of 8 up to {h_max})"
    if bias is not None:
        b_shape = (1,) * (4 - len(bias.shape)) + tuple(bias.shape)
        if b_shape[2:] != (T, S):
            return f"bias of shape {tuple(bias.shape)} does not span the query and key lengths [{T}, {S}]"
        combined = b_shape if mask is None else jnp.broadcast_shapes(b_shape, (1,) * (4 - len(mask.shape)) +
                                                                    tuple(mask.shape))
        if training and not _dbias_exported(combined, q.shape):
            return f"this jax returns no cuDNN gradient for a bias of shape {combined} (only [1, N, T, S])"
    if training and (bias is not None or mask is not None) and (T % 2 or S % 2):
        return f"odd length (T={T}, S={S}) with a mask or bias in training"
    return None


def _dbias_exported(bias_shape, q_shape) -> bool:
    """jax's own rule for whether its cuDNN attention returns the bias gradient (False if it cannot be asked)."""
    try:
        from jax._src.cudnn import fused_attention_stablehlo as fa
    except Exception:  # moved: assume not, so a learned bias keeps a correct gradient (XLA)
        return False
    rule = getattr(fa, "should_export_dbias", None)
    if rule is None:  # jax 0.11.2 dropped the rule: the bias gradient comes whenever a bias is given, summed
        return True   # over a broadcast batch (seen on an H200: without this, T5 fell back to XLA)
    try:
        return bool(rule(tuple(bias_shape), tuple(q_shape), fa.AttentionLayout.BTNH.value))
    except Exception:  # its signature changed: assume not (XLA)
        return False


@functools.lru_cache(maxsize=None)
def gpu_compute_capability() -> str | None:
    """The compute capability of jax's first device ("9.0"); "not CUDA" for a GPU of another vendor (ROCm);
    None when it is not a GPU or does not say."""
    device = jax.devices()[0]
    if device.platform != "gpu":
        return None
    version = str(getattr(getattr(device, "client", None), "platform_version", "cuda")).lower()
    return getattr(device, "compute_capability", None) if "cuda" in version else "not CUDA"


def note_fallback(reason: str, kernel: str = "cuDNN flash attention") -> None:
    """Log, once per reason, that `auto` attention runs XLA instead of `kernel`."""
    if reason not in FALLBACKS:
        FALLBACKS.add(reason)
        log.warning("attention: model.attention_impl=auto runs XLA here, not %s: %s", kernel, reason)


def select_backend(implementation, q, k, v, bias=None, mask=None, *, is_causal=False, training=True,
                   platform: str | None = None) -> str:
    """`resolve_attention`, then for auto on a GPU: cuDNN if `cudnn_unsupported_reason` finds nothing, else xla
    (the reason logged once); on TPU the same with splash and `splash_unsupported_reason` (splash named
    explicitly raises with the reason). A backend named explicitly is returned as is (cuDNN then raises if it
    must)."""
    backend = resolve_attention(implementation, platform)
    if backend == "splash":
        reason = splash_unsupported_reason(q, k, v, bias, mask)
        if reason and implementation == "splash":
            raise ValueError(f"model.attention_impl=splash cannot run this attention: {reason}")
        if reason:
            note_fallback(reason, "splash attention (Pallas)")
        return "xla" if reason else "splash"
    if backend != "cudnn" or implementation not in (None, "auto"):
        return backend
    if platform is None and jax.default_backend() == "gpu":
        cc = gpu_compute_capability()
    else:
        cc = None
    reason = cudnn_unsupported_reason(q, k, v, bias, mask, is_causal=is_causal, training=training,
                                      compute_capability=cc)
    if reason:
        note_fallback(reason)
        return "xla"
    return "cudnn"

