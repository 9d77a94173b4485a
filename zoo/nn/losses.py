"""Cross-entropy of a tied (or untied) output projection, fused: the [B, T, V] logits never exist whole.

`linear_cross_entropy(h_BTD, w_VD, targets_BT, weights_BT)` is the weighted cross-entropy of the
logits h @ w.T (loss sum and correct-prediction sum), but:

- the rows are taken in chunks of the length axis (a `lax.scan` when there are several), so the
  largest live buffer is [B, T/chunks, V] instead of [B, T, V] logits plus their gradient; the chunk
  count depends on the device (on CPU the one that moves the fewest bytes through memory, chunks whose
  logits fit the cache where the [V, D] accumulator is small; a few large ones on GPU/TPU);
- the gradient with respect to h, w and the bias is produced in the same pass as the loss
  (softmax - one-hot, then the two backward matmuls per chunk) and kept as the residual of a
  `jax.custom_vjp`: no logits are saved for the backward pass and none are recomputed, there is no
  scatter for the one-hot and no argmax. The loss is linear in its cotangent, so the backward rule
  only scales the stored gradients. Without differentiation (eval) only the loss is computed.

The batch axis stays whole in every chunk, so data-parallel sharding over B is untouched; a vocab
axis sharded over `tensor` reduces across shards as usual.

On a GPU/TPU the vocab axis of the projection is padded to a multiple of VOCAB_MULTIPLE (the padded
logits masked to -inf), as nanoGPT pads GPT-2's 50257 to 50304: otherwise XLA pads each chunk's logit
gradient itself before the backward matmuls (an H200 profile of GPT-2 124M at B=16, T=1024 spent 1.9 of
35.6 ms a step in those pads). The parameters keep their own shape; only the matmul operands are padded.

A prediction counts as correct when the target's logit equals the row maximum (argmax without the
tie-break toward the lower id; ties between float32 logits do not occur in practice).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from zoo.nn.layers import DATA_AXES, einsum_f32, softcap, target_platform

# Chunk the length axis so that one chunk's float32 logits stay at or below a budget. On GPU/TPU a few large
# chunks, since every chunk is a sequential scan step with its own pair of backward matmuls and the [V, D]
# gradient accumulation: 1/64 of the device's memory, between 256 MB and 2 GB (1 GB when the device does not
# say). GPT-2 at B=16, T=1024, V=50257 (3.3 GB of logits) is then 4 chunks on an 80 GB H100 (jax's default 75%
# memory limit), 2 to 4 on an H200. The platform is the one the program is traced for (`target_platform`: a TPU
# topology compiled from a CPU host gets the TPU budget) and the rows are those one device holds (a step traced
# under its mesh splits the batch over the data axes).
#
# On a CPU the budget is a memory cap (CHUNK_BYTES) and the count within it is the one that moves the fewest bytes
# through memory (`cpu_traffic`): a chunk whose logits fit the last-level cache (CPU_CACHE_BYTES) costs its
# softmax passes nothing in memory traffic, one that does not costs LOGIT_PASSES passes over its logits, and
# every chunk reads and writes the [V, D] float32 gradient accumulator once. Measured on this 2-core EPYC (32 MB
# L3; grad of the loss alone, best of 15): GPT-2-shaped V=8192, D=256 over 2,048 rows took 381 ms as one
# 64 MB chunk and 260 ms as four 16 MB ones (the gpt_train step 11% faster); SmolLM2's V=49152, D=576 over
# 1,024 rows 1,957 ms as one 192 MB chunk and 2,272 ms as eight (its 113 MB accumulator read and written 8 times).
CHUNK_BYTES = 256 * 2 ** 20
CPU_CACHE_BYTES = 16 * 2 ** 20
LOGIT_PASSES = 4
ACCEL_CHUNK_BYTES = 2 ** 30
ACCEL_CHUNK_RANGE = (256 * 2 ** 20, 2 * 2 ** 30)
ACCEL_MEMORY_FRACTION = 1 / 64


def chunk_budget(platform: str | None = None, memory_bytes: int | None = None) -> int:
    """Bytes of float32 logits one chunk may hold on `platform` (default: the platform the program is traced
    for, `layers.target_platform`): CHUNK_BYTES on CPU; on GPU/TPU ACCEL_MEMORY_FRACTION of `memory_bytes`
    (default: the first device's memory limit, when it reports one and is that platform's) clamped to
    ACCEL_CHUNK_RANGE, else ACCEL_CHUNK_BYTES."""
    platform = platform or target_platform()
    if platform == "cpu":
        return CHUNK_BYTES
    if memory_bytes is None and platform == jax.default_backend():
        memory_bytes = _device_memory()
    if not memory_bytes:
        return ACCEL_CHUNK_BYTES
    lo, hi = ACCEL_CHUNK_RANGE
    return int(min(max(memory_bytes * ACCEL_MEMORY_FRACTION, lo), hi))


@functools.lru_cache(maxsize=None)
def _device_memory() -> int | None:
    try:
        stats = jax.local_devices()[0].memory_stats() or {}
    except Exception:  # a backend without memory statistics
        return None
    return stats.get("bytes_limit")


def local_rows(B: int) -> int:
    """Of a global batch of B rows, those one device holds: B over the data axes of the mesh the program is
    traced under (jax.set_mesh, as a TPU step is), where they divide it; else B."""
    mesh = jax.sharding.get_abstract_mesh()
    n = 1 if mesh.empty else math.prod(mesh.shape.get(a, 1) for a in DATA_AXES)
    return B // n if B % n == 0 else B


def num_chunks(B: int, T: int, V: int, chunk_bytes: int | None = None, D: int | None = None,
               platform: str | None = None) -> int:
    """The chunks of the length axis T (a divisor of T) to run the loss in, b the rows of the global batch B one
    device holds (`local_rows`): of the counts whose [b, T/n, V] float32 logits fit chunk_bytes (default:
    `chunk_budget()` for `platform`, default the platform traced for), the fewest; on a CPU, with the width D
    known, the one that moves the fewest bytes (`cpu_traffic`, the fewest chunks on a tie)."""
    platform = platform or target_platform()
    chunk_bytes = chunk_budget(platform) if chunk_bytes is None else chunk_bytes
    B = local_rows(B)
    fits = [n for n in range(1, T + 1) if T % n == 0 and B * (T // n) * V * 4 <= chunk_bytes] or [T]
    if platform != "cpu" or D is None:
        return fits[0]
    return min(fits, key=lambda n: cpu_traffic(n, B, T, V, D))


def cpu_traffic(n: int, B: int, T: int, V: int, D: int) -> int:
    """Bytes the fused loss moves through memory beyond its matmuls' operands in n chunks on a CPU: the [V, D]
    float32 gradient accumulator read and written per chunk, and LOGIT_PASSES passes over all [B, T, V] float32
    logits when one chunk's logits overflow the cache (CPU_CACHE_BYTES)."""
    spills = B * (T // n) * V * 4 > CPU_CACHE_BYTES
    return n * 2 * V * D * 4 + (LOGIT_PASSES * B * T * V * 4 if spills else 0)


def _chunk_stats(h_BCD, w_VD, bias_V, t_BC, smoothing: float, with_grad: bool, vocab: int | None = None,
                 cap: float = 0.0):
    """Loss and correct per row of one chunk, and (with_grad) d loss / d logits weighted later. Columns
    from `vocab` on (padding) are masked out: -inf logits, zero gradient. `cap` > 0 soft-caps the logits
    (cap * tanh(z / cap), Gemma 2), the gradient taken through it."""
    logits_BCV = einsum_f32("BCD,VD->BCV", h_BCD, w_VD.astype(h_BCD.dtype))
    if bias_V is not None:
        logits_BCV = logits_BCV + bias_V.astype(jnp.float32)
    if cap:
        logits_BCV = softcap(logits_BCV, cap)
    V = logits_BCV.shape[-1] if vocab is None else vocab
    real_V = None
    if V < logits_BCV.shape[-1]:
        real_V = jnp.arange(logits_BCV.shape[-1]) < V
        logits_BCV = jnp.where(real_V, logits_BCV, -jnp.inf)
    max_BC = jnp.max(logits_BCV, -1)
    e_BCV = jnp.exp(logits_BCV - max_BC[..., None])
    sum_BC = jnp.sum(e_BCV, -1)
    target_BC = jnp.take_along_axis(logits_BCV, t_BC[..., None], -1)[..., 0]
    loss_BC = max_BC + jnp.log(sum_BC) - target_BC
    if smoothing:
        # Against (1 - s) one-hot + s uniform: lse - (1 - s) z_t - s mean(z).
        real_logits_BCV = logits_BCV if real_V is None else jnp.where(real_V, logits_BCV, 0.0)
        loss_BC = loss_BC + smoothing * (target_BC - jnp.sum(real_logits_BCV, -1) / V)
    correct_BC = (target_BC >= max_BC).astype(jnp.float32)
    if not with_grad:
        return loss_BC, correct_BC, None
    onehot_BCV = jnp.arange(logits_BCV.shape[-1])[None, None] == t_BC[..., None]
    dz_BCV = e_BCV / sum_BC[..., None] - jnp.where(onehot_BCV, 1.0 - smoothing, 0.0)
    if smoothing:
        dz_BCV = dz_BCV - (smoothing / V if real_V is None else jnp.where(real_V, smoothing / V, 0.0))
    if cap:  # d(cap tanh(z / cap)) / dz = 1 - tanh^2 = 1 - (capped / cap)^2 (0 on the -inf padding's 0 gradient)
        dz_BCV = dz_BCV * (1.0 - jnp.square(jnp.where(jnp.isfinite(logits_BCV), logits_BCV, 0.0) / cap))
    return loss_BC, correct_BC, dz_BCV


def _split(x, n):
    """[B, T, ...] -> [n, B, T/n, ...]: chunks of the length axis, batch axis kept whole."""
    return jnp.moveaxis(x.reshape(x.shape[0], n, x.shape[1] // n, *x.shape[2:]), 1, 0)


def _merge(x):
    """[n, B, C, ...] -> [B, n*C, ...]."""
    x = jnp.moveaxis(x, 0, 1)
    return x.reshape(x.shape[0], -1, *x.shape[3:])


def _run(h_BTD, w_VD, bias_V, targets_BT, weights_BT, smoothing, n, with_grad, vocab=None, cap=0.0):
    """(loss_sum, correct_sum), and with_grad: (dh_BTD, dw_VD, dbias_V) of loss_sum."""
    def chunk(h_BCD, t_BC, wt_BC):
        loss_BC, correct_BC, dz_BCV = _chunk_stats(h_BCD, w_VD, bias_V, t_BC, smoothing, with_grad, vocab, cap)
        sums = (jnp.sum(loss_BC * wt_BC), jnp.sum(correct_BC * wt_BC))
        if not with_grad:
            return sums, None
        dz_BCV = (dz_BCV * wt_BC[..., None]).astype(h_BCD.dtype)
        dh_BCD = einsum_f32("BCV,VD->BCD", dz_BCV, w_VD.astype(h_BCD.dtype))
        # As D x V then transposed: the contraction runs over the leading axes of both operands, and this
        # order keeps the big dz as the row-major right-hand side (no [V, B*C] transpose of dz on CPU).
        dw_VD = einsum_f32("BCD,BCV->DV", h_BCD, dz_BCV).T
        db_V = None if bias_V is None else jnp.sum(dz_BCV.astype(jnp.float32), (0, 1))
        return sums, (dh_BCD.astype(h_BCD.dtype), dw_VD, db_V)

    if n == 1:
        return chunk(h_BTD, targets_BT, weights_BT)

    def body(carry, xs):
        sums, grads = chunk(*xs)
        (loss, correct), acc = carry
        new = (loss + sums[0], correct + sums[1])
        if not with_grad:
            return (new, acc), None
        dh_BCD, dw_VD, db_V = grads
        acc = (acc[0] + dw_VD, None if db_V is None else acc[1] + db_V)
        return (new, acc), dh_BCD

    zero = jnp.zeros((), jnp.float32)
    acc0 = (jnp.zeros(w_VD.shape, jnp.float32), None if bias_V is None else jnp.zeros(bias_V.shape, jnp.float32)) \
        if with_grad else None
    (sums, acc), dh_nBCD = jax.lax.scan(body, ((zero, zero), acc0),
                                        (_split(h_BTD, n), _split(targets_BT, n), _split(weights_BT, n)))
    if not with_grad:
        return sums, None
    return sums, (_merge(dh_nBCD), acc[0], acc[1])


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _fused(h_BTD, w_VD, bias_V, targets_BT, weights_BT, smoothing, n, vocab, cap):
    return _run(h_BTD, w_VD, bias_V, targets_BT, weights_BT, smoothing, n, False, vocab, cap)[0]


def _fused_fwd(h_BTD, w_VD, bias_V, targets_BT, weights_BT, smoothing, n, vocab, cap):
    sums, (dh_BTD, dw_VD, db_V) = _run(h_BTD, w_VD, bias_V, targets_BT, weights_BT, smoothing, n, True, vocab, cap)
    grads = (dh_BTD, dw_VD.astype(w_VD.dtype), None if db_V is None else db_V.astype(bias_V.dtype))
    return sums, (grads, targets_BT, weights_BT)


def _fused_bwd(smoothing, n, vocab, cap, res, g):
    grads, targets_BT, weights_BT = res
    g_loss = g[0]  # the correct-count output is not differentiable
    dh_BTD, dw_VD, db_V = (None if x is None else x * g_loss.astype(x.dtype) for x in grads)
    return (dh_BTD, dw_VD, db_V, jnp.zeros(targets_BT.shape, jax.dtypes.float0), jnp.zeros_like(weights_BT))


_fused.defvjp(_fused_fwd, _fused_bwd)


def linear_cross_entropy(h_BTD, w_VD, targets_BT, weights_BT, *, bias_V=None, label_smoothing: float = 0.0,
                         chunks: int | None = None, vocab_multiple: int | None = None, logit_cap: float = 0.0):
    """(sum of weighted token cross-entropies, sum of weighted correct predictions) of logits
    h_BTD @ w_VD.T (+ bias_V), float32, soft-capped to logit_cap * tanh(logits / logit_cap) when logit_cap > 0
    (Gemma 2's final_logit_softcapping). `chunks` (a divisor of T) defaults to num_chunks(B, T, V, D=D);
    `vocab_multiple` (default: `vocab_pad_multiple()` of the backend) pads the matmuls' vocab axis."""
    B, T, D = h_BTD.shape
    V = w_VD.shape[0]
    n = chunks or num_chunks(B, T, V, D=D)
    if T % n:
        raise ValueError(f"chunks={n} does not divide the length {T}")
    m = vocab_multiple or vocab_pad_multiple()
    pad = -V % m
    if pad:  # the gradients of the padded rows are sliced off by jnp.pad's own transpose
        w_VD = jnp.pad(w_VD, ((0, pad), (0, 0)))
        bias_V = None if bias_V is None else jnp.pad(bias_V, (0, pad))
    return _fused(h_BTD, w_VD, bias_V, targets_BT, weights_BT.astype(jnp.float32), float(label_smoothing), n, V,
                  float(logit_cap))


VOCAB_MULTIPLE = 128  # on accelerators; a CPU runs the vocab as it is (its matmuls need no alignment)


def vocab_pad_multiple(platform: str | None = None) -> int:
    """The multiple the fused loss pads the vocab axis to on `platform` (default: jax's default backend)."""
    return 1 if (platform or jax.default_backend()) == "cpu" else VOCAB_MULTIPLE


def token_correct(h_BTD, w_VD, targets_BT, *, bias_V=None, chunks: int | None = None):
    """bool[B, T]: whether each target is the argmax of its logits h_BTD @ w_VD.T (+ bias_V), as the fused
    loss counts `correct`, chunk by chunk (no [B, T, V] logits) and without a gradient (evaluation)."""
    B, T, D = h_BTD.shape
    n = chunks or num_chunks(B, T, w_VD.shape[0], D=D)
    h_BTD, w_VD = jax.lax.stop_gradient(h_BTD), jax.lax.stop_gradient(w_VD)

    def chunk(_, xs):
        h_BCD, t_BC = xs
        _, correct_BC, _ = _chunk_stats(h_BCD, w_VD, bias_V, t_BC, 0.0, False)
        return None, correct_BC > 0
    _, out = jax.lax.scan(chunk, None, (_split(h_BTD, n), _split(targets_BT, n)))
    return _merge(out)


def token_logprobs(h_BTD, w_VD, targets_BT, *, bias_V=None, logit_cap: float = 0.0, chunks: int | None = None):
    """float32[B, T]: log p(target) of each position under logits h_BTD @ w_VD.T (+ bias_V), soft-capped as the
    fused loss caps them: minus the loss it sums, per token, chunk by chunk (no [B, T, V] logits) and without a
    gradient (scoring: zoo.eval.loglik, zoo.load(...).logprobs)."""
    B, T, D = h_BTD.shape
    n = chunks or num_chunks(B, T, w_VD.shape[0], D=D)
    h_BTD, w_VD = jax.lax.stop_gradient(h_BTD), jax.lax.stop_gradient(w_VD)

    def chunk(_, xs):
        h_BCD, t_BC = xs
        loss_BC, _, _ = _chunk_stats(h_BCD, w_VD, bias_V, t_BC, 0.0, False, cap=logit_cap)
        return None, -loss_BC
    _, out = jax.lax.scan(chunk, None, (_split(h_BTD, n), _split(targets_BT, n)))
    return _merge(out)


def token_logprobs_grad(h_BTD, w_VD, targets_BT, *, bias_V=None, logit_cap: float = 0.0, chunks: int | None = None,
                        temperature: float = 1.0):
    """float32[B, T]: log p(target) at each position, differentiable (an objective of per-token log-probabilities:
    zoo.tasks.rl), under the (soft-capped) logits divided by `temperature` (the distribution sampled at it). Chunk by
    chunk of the length axis, each chunk's [B, C, V] logits recomputed in the backward pass (jax.checkpoint) rather
    than kept."""
    B, T, D = h_BTD.shape
    n = chunks or num_chunks(B, T, w_VD.shape[0], D=D)

    @jax.checkpoint
    def chunk(h_BCD, t_BC):
        logits_BCV = einsum_f32("BCD,VD->BCV", h_BCD, w_VD.astype(h_BCD.dtype))
        if bias_V is not None:
            logits_BCV = logits_BCV + bias_V.astype(jnp.float32)
        if logit_cap:
            logits_BCV = softcap(logits_BCV, logit_cap)
        if temperature != 1.0:
            logits_BCV = logits_BCV / temperature
        return jnp.take_along_axis(jax.nn.log_softmax(logits_BCV, -1), t_BC[..., None], -1)[..., 0]

    _, out = jax.lax.scan(lambda c, xs: (c, chunk(*xs)), None, (_split(h_BTD, n), _split(targets_BT, n)))
    return _merge(out)
