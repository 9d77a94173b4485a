"""A frozen base held quantized (QLoRA): int8 or 4-bit NormalFloat kernels, dequantized inside the matmul.

A quantized kernel is a `qkernel` param in place of the Einsum's `kernel`: {"codes", "scale"}, the kernel
seen as a matrix [in, out] (its contracted axes flattened, then its output axes; a scanned stack keeps its
leading layers axis):

- int8: codes int8 [in, out], round(w / scale) with one absmax scale per output column, scale [1, out];
- nf4 (QLoRA, Dettmers et al. 2023): the 16 NormalFloat levels, absmax-scaled per block of `NF4_BLOCK`
  consecutive inputs of a column, two 4-bit codes per byte: codes uint8 [in / 2, out], scale [in / block,
  out] (float32; QLoRA's second quantization of the scales is not done). 0.5625 bytes per weight.

`einsum` has its own backward rule that dequantizes again, so the dequantized weight is not kept alive from
the forward pass to the backward one (`jax.checkpoint` alone did not do it on CPU: XLA merged the two
dequantizations); only the codes stay resident.

Why not google's qwix (the library Tunix and MaxText use): as released (0.1.8) it stops at zoo's first
adapted Einsum (its LoRA einsum sets a debugging attribute on the module, which linen refuses, and its
quantized kernel's astype fails); with those two bypassed, `python -m zoo.bench.qlora` (SmolLM2-135M shape,
30 layers, B=4, T=256, CPU) measured its NF4 QLoRA at 2,656 MB of state and step temporaries and 6.8 s a
step against this module's 2,613 MB and 6.2 s. And here the frozen half is zoo's own state: sharded by the
one rules table, checksummed and restored like any param, no second param representation to teach them.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

NF4_BLOCK = 64
# The 16 NF4 levels (QLoRA, Appendix E): quantiles of N(0, 1) scaled to [-1, 1], with an exact zero.
NF4 = np.asarray([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                  -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                  0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                  0.7229568362236023, 1.0], np.float32)
KINDS = ("int8", "nf4")


def scanned(q: dict) -> bool:
    return jnp.ndim(q["codes"]) == 3


def block_size(n_in: int) -> int:
    """NF4's block along the inputs: NF4_BLOCK, or the largest power of two dividing the input count."""
    return math.gcd(n_in, NF4_BLOCK)


@functools.partial(jax.jit, static_argnames=("n_in", "kind", "lead"))
def quantize(w, n_in: int, kind: str, lead: int = 0) -> dict:
    """The qkernel of kernel `w` whose `n_in` axes after `lead` leading (layers) axes are its inputs. Jitted, one
    program per kernel shape: op by op, nf4 materialised a [inputs, outputs, 15] comparison against the levels'
    midpoints (0.9 GB of booleans for one 4096 x 14336 kernel), which XLA can fuse into its sum."""
    lead_shape = w.shape[:lead]
    n = math.prod(w.shape[lead:lead + n_in])
    w2 = jnp.asarray(w, jnp.float32).reshape(*lead_shape, n, -1)
    if kind == "int8":
        scale = jnp.max(jnp.abs(w2), axis=-2, keepdims=True) / 127.0
        scale = jnp.where(scale > 0, scale, 1.0)
        return {"codes": jnp.clip(jnp.round(w2 / scale), -127, 127).astype(jnp.int8), "scale": scale}
    if kind != "nf4":
        raise ValueError(f"quantization {kind!r}; choose one of {', '.join(KINDS)}")
    if n % 2:
        raise ValueError(f"nf4 packs two codes per byte: {n} inputs is odd")
    blk = block_size(n)
    wb = w2.reshape(*lead_shape, n // blk, blk, w2.shape[-1])
    scale = jnp.max(jnp.abs(wb), axis=-2, keepdims=True)
    scale = jnp.where(scale > 0, scale, 1.0)
    # The nearest level: count the midpoints between levels that the normalised weight lies above.
    mids = jnp.asarray((NF4[1:] + NF4[:-1]) / 2)
    codes = jnp.sum((wb / scale)[..., None] > mids, axis=-1).astype(jnp.uint8).reshape(w2.shape)
    packed = codes[..., 0::2, :] | (codes[..., 1::2, :] << 4)
    return {"codes": packed, "scale": scale[..., 0, :]}


def dequantize(q: dict, shape: tuple, dtype) -> jax.Array:
    """The kernel of shape `shape` (leading layers axis included) that qkernel `q` holds, in `dtype`."""
    codes, scale = q["codes"], jnp.asarray(q["scale"], jnp.float32)
    if codes.dtype == jnp.int8:
        w2 = codes.astype(jnp.float32) * scale
    else:
        lo, hi = codes & 15, codes >> 4
        idx = jnp.stack([lo, hi], axis=-2).reshape(*codes.shape[:-2], codes.shape[-2] * 2, codes.shape[-1])
        blk = idx.shape[-2] // scale.shape[-2]
        w2 = jnp.take(jnp.asarray(NF4), idx.astype(jnp.int32)) * jnp.repeat(scale, blk, axis=-2)
    return w2.reshape(shape).astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3, 4))
def einsum(eqn: str, x, q: dict, shape: tuple, dtype):
    """jnp.einsum(eqn, x, kernel) with the kernel dequantized from `q`; the backward pass dequantizes again,
    so only x and the codes are kept for it. The frozen codes get no gradient."""
    return jnp.einsum(eqn, x, _dequantize_after(x, q, shape, dtype))


def _dequantize_after(y, q: dict, shape: tuple, dtype):
    """dequantize(q) made to depend on the array `y` by a runtime zero added to the codes (y != y: false
    unless y holds a NaN, when nothing is finite anyway). XLA then neither dequantizes every kernel of the
    model up front, before the first matmul needs one, nor merges the backward pass's dequantization with
    the forward's, which would keep each dequantized kernel alive from one pass to the other."""
    zero = (y.reshape(-1)[0] != y.reshape(-1)[0]).astype(q["codes"].dtype)
    return dequantize({**q, "codes": q["codes"] + zero}, shape, dtype)


def _einsum_fwd(eqn, x, q, shape, dtype):
    return einsum(eqn, x, q, shape, dtype), (x, q)


def _einsum_bwd(eqn, shape, dtype, res, g):
    x, q = res
    w = _dequantize_after(g, q, shape, dtype)
    dx = jax.vjp(lambda x_: jnp.einsum(eqn, x_, w), x)[1](g)[0]
    frozen = {k: np.zeros(v.shape, jax.dtypes.float0) if not jnp.issubdtype(v.dtype, jnp.floating)
              else jnp.zeros_like(v) for k, v in q.items()}
    return dx, frozen


einsum.defvjp(_einsum_fwd, _einsum_bwd)


def nbytes(q: dict) -> int:
    return sum(int(np.prod(v.shape)) * jnp.dtype(v.dtype).itemsize for v in q.values())
