"""A decoding cache held in pages (vLLM's PagedAttention layout), read and written by `Attention` in place.

Under `paged(table_BN)` each self-attention layer's "cache" variables `cached_key` / `cached_value` are a pool
of pages, `[pages, PAGE, K, H]`, shared by every row, instead of a dense `[B, S, K, H]` per row: row b's
position p lies in page `table_BN[b, p // PAGE]` at offset `p % PAGE`. A decoding step writes its new keys and
values into their pages (a scatter of B x T entries into the pool, which a donated or loop-carried buffer takes in
place) and attends over the row's first N pages, gathered layer by layer where the attention reads them: no
whole-model dense view is built, and nothing is copied back (zoo.engine.programs: a decode step, T = 1, and a
prefill of T prompt tokens a row alike). A negative position (a free row, right padding) writes to page 0, which
the engine keeps as scratch (zoo.engine.pages), and so does a position before the row's `write_from` (a prefill
moved back to fit the window computes again tokens whose pages other rows may share: they are read, not written).

With a `kernel` (zoo.nn.paged_kernels: jax's Pallas ragged paged attention, on TPU) keys and values are one pool,
`[pages, PAGE, 2K, H]` (each key head followed by its value head, as the kernel reads them) held by `cached_key`,
`cached_value` empty: a decoding step writes its tokens into it and attends by the kernel over each row's pages
where they lie; a prefill writes the same way and reads the pool by the gather.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import NamedTuple

import jax.numpy as jnp

_TABLE: contextvars.ContextVar = contextvars.ContextVar("zoo_paged_cache", default=None)


class Paged(NamedTuple):
    table_BN: object  # [B, N] int32: each row's first N page ids
    write_from_B: object = None  # [B]: a row's positions before it are read, not written; None: 0
    kernel: str | None = None  # zoo.nn.paged_kernels' kernel decoding attends by (keys and values one pool); None


@contextlib.contextmanager
def paged(table_BN, write_from_B=None, kernel: str | None = None):
    """Within it (while a model is traced), decoding reads and writes its cache as pages of a pool through
    table_BN ([B, N] int32: each row's first N page ids); `write_from_B` ([B], None: 0): a row's positions before
    it are read from its pages, not written; `kernel` (zoo.nn.paged_kernels.KERNELS): keys and values are one pool
    [P, PAGE, 2K, H] (in `cached_key`) and a decoding step attends by that kernel."""
    token = _TABLE.set(Paged(table_BN, write_from_B, kernel))
    try:
        yield
    finally:
        _TABLE.reset(token)


def current() -> Paged | None:
    """The `paged` block the model is traced under, or None (a dense cache)."""
    return _TABLE.get()


def write(key, value, k_BTKH, v_BTKH, positions_BT, paged: Paged) -> None:
    """Each row's keys and values written at its positions' pages and offsets (a negative position, or one before
    the row's write_from_B: page 0, scratch), the pools `key` / `value` (flax variables, [P, PAGE, K, H] each; with
    a kernel `key` alone, [P, PAGE, 2K, H]) updated in place."""
    table_BN, write_from_B = paged.table_BN, paged.write_from_B
    PAGE = key.value.shape[1]
    writes_BT = positions_BT >= (0 if write_from_B is None else jnp.maximum(write_from_B, 0)[:, None])
    page_BT = jnp.where(writes_BT, jnp.take_along_axis(table_BN, jnp.maximum(positions_BT, 0) // PAGE, axis=1), 0)
    off_BT = jnp.where(writes_BT, positions_BT % PAGE, 0)
    pairs = ((key, k_BTKH), (value, v_BTKH))
    if paged.kernel:  # a token's [2K, H]: each key head followed by its value head
        B, T, K, H = k_BTKH.shape
        pairs = ((key, jnp.stack([k_BTKH, v_BTKH], axis=3).reshape(B, T, 2 * K, H)),)
    for var, x_BTKH in pairs:
        var.value = var.value.at[page_BT, off_BT].set(x_BTKH.astype(var.value.dtype), mode="promise_in_bounds")


def write_read(key, value, k_BTKH, v_BTKH, positions_BT, paged: Paged):
    """`write`, then the rows' views of their first N pages, [B, N * PAGE, K, H] each, and mask_B1TS (a query sees
    the slots at or before its position)."""
    write(key, value, k_BTKH, v_BTKH, positions_BT, paged)
    B, N = paged.table_BN.shape
    PAGE = key.value.shape[1]
    flat_X = paged.table_BN.reshape(-1)
    if paged.kernel:  # [B, N * PAGE, 2K, H]: keys at the even heads, values at the odd
        kv = key.value.at[flat_X].get(mode="promise_in_bounds").reshape(B, N * PAGE, *key.value.shape[2:])
        views = [kv[:, :, 0::2], kv[:, :, 1::2]]
    else:
        views = [v.value.at[flat_X].get(mode="promise_in_bounds").reshape(B, N * PAGE, *v.value.shape[2:])
                 for v in (key, value)]
    mask_B1TS = (jnp.arange(N * PAGE)[None, None, :] <= positions_BT[:, :, None])[:, None]
    return views[0], views[1], mask_B1TS

