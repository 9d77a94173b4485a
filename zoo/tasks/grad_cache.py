"""A gradient cache (GradCache; sentence-transformers' CachedMultipleNegativesRankingLoss): a function of a batch's
rows, run over chunks of them so that the activations of one chunk at a time are held, where the loss after it
(task=embed's MNRL) still sees every row's output at once.

`map_rows(f, xs, rows, rng)` runs `f` over chunks of `rows` rows under `jax.checkpoint` inside one `lax.map`. The
forward keeps each chunk's output (an embedding per text) and its inputs, not its activations; differentiating
through it gives GradCache's backward: the loss's gradient with respect to every output first (the cached
gradient), then each chunk's forward run again with its VJP, one chunk at a time, the parameter gradients summed
across chunks by the scan's transpose. Inside the jitted step, so under data parallelism the chunks are strided
(chunk c holds rows c, c + C, c + 2C, ...), as train.grad_accum's microbatches are: each device keeps an equal
share of every chunk while C divides its rows. A chunk size that does not divide the batch pads the last chunk
with copies of the first rows, whose outputs are dropped (their gradient is zero)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def map_rows(f, xs, rows: int, rng):
    """f(*xs, rng) over the leading axis of each array in the tuple `xs` (B rows), `rows` rows at a time; chunk c's
    rng is fold_in(rng, c), the same in the forward and in its replay. The outputs' leading axis is B again."""
    B = xs[0].shape[0]
    C = -(-B // rows)  # chunks
    pad = C * rows - B  # < rows <= B

    def chunked(x):  # [B, ...] -> [C, rows, ...]: row j * C + c of the padded batch is chunk c's j-th
        x = jnp.concatenate([x, x[:pad]]) if pad else x
        return x.reshape(rows, C, *x.shape[1:]).swapaxes(0, 1)

    @jax.checkpoint  # saves the chunk's inputs alone: its activations are recomputed by the backward, chunk by chunk
    def one(args):
        c, xs_c = args
        return f(*xs_c, jax.random.fold_in(rng, c))

    out = jax.lax.map(one, (jnp.arange(C), tuple(chunked(x) for x in xs)))
    return jax.tree.map(lambda y: y.swapaxes(0, 1).reshape(C * rows, *y.shape[2:])[:B], out)
