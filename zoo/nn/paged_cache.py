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

With a `kernel` (zoo.nn.paged_kernels: jax's Pallas paged attention, on TPU) the pools are laid out heads first,
`[K, pages, PAGE, H]` (`[layers, K, ...]` scanned), as the kernel reads them: a decoding step's attention is the
kernel's, over each row's pages where they lie; a prefill reads the same pools by the gather.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import NamedTuple

import jax
import jax.numpy as jnp

_TABLE: contextvars.ContextVar = contextvars.ContextVar("zoo_paged_cache", default=None)


class Paged(NamedTuple):
    table_BN: object  # [B, N] int32: each row's first N page ids
    write_from_B: object = None  # [B]: a row's positions before it are read, not written; None: 0
    kernel: str | None = None  # zoo.nn.paged_kernels' kernel decoding attends by (the pools heads first); None


@contextlib.contextmanager
def paged(table_BN, write_from_B=None, kernel: str | None = None):
    """Within it (while a model is traced), decoding reads and writes its cache as pages of a pool through
    table_BN ([B, N] int32: each row's first N page ids); `write_from_B` ([B], None: 0): a row's positions before
    it are read from its pages, not written; `kernel` (zoo.nn.paged_kernels.KERNELS): the pools are [K, P, PAGE, H]
    and a decoding step attends by that kernel."""
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
    the row's write_from_B: page 0, scratch), the pools `key` / `value` (flax variables: [P, PAGE, K, H], or
    [K, P, PAGE, H] with a kernel) updated in place."""
    table_BN, write_from_B = paged.table_BN, paged.write_from_B
    PAGE = key.value.shape[2 if paged.kernel else 1]
    writes_BT = positions_BT >= (0 if write_from_B is None else jnp.maximum(write_from_B, 0)[:, None])
    page_BT = jnp.where(writes_BT, jnp.take_along_axis(table_BN, jnp.maximum(positions_BT, 0) // PAGE, axis=1), 0)
    off_BT = jnp.where(writes_BT, positions_BT % PAGE, 0)
    for var, x_BTKH in ((key, k_BTKH), (value, v_BTKH)):
        x_BTKH = x_BTKH.astype(var.value.dtype)
        if paged.kernel:  # [K, P, PAGE, H]: each row's T entries of every head, one slice at a time
            var.value = _write_slices(var.value, x_BTKH, page_BT, off_BT)
        else:
            var.value = var.value.at[page_BT, off_BT].set(x_BTKH, mode="promise_in_bounds")


def write_read(key, value, k_BTKH, v_BTKH, positions_BT, paged: Paged):
    """`write`, then the rows' views of their first N pages, [B, N * PAGE, K, H] each, and mask_B1TS (a query sees
    the slots at or before its position)."""
    write(key, value, k_BTKH, v_BTKH, positions_BT, paged)
    B, N = paged.table_BN.shape
    flat_X = paged.table_BN.reshape(-1)
    if paged.kernel:  # [K, B * N, PAGE, H] -> [B, N * PAGE, K, H]
        K, _, PAGE, H = key.value.shape
        views = [v.value.at[:, flat_X].get(mode="promise_in_bounds").reshape(K, B, N * PAGE, H).transpose(1, 2, 0, 3)
                 for v in (key, value)]
    else:
        PAGE = key.value.shape[1]
        views = [v.value.at[flat_X].get(mode="promise_in_bounds").reshape(B, N * PAGE, *v.value.shape[2:])
                 for v in (key, value)]
    mask_B1TS = (jnp.arange(N * PAGE)[None, None, :] <= positions_BT[:, :, None])[:, None]
    return views[0], views[1], mask_B1TS


def _write_slices(pool_KPXH, x_BTKH, page_BT, off_BT):
    """x's [K, H] entries written at (page, offset) one dynamic_update_slice each, a loop over B x T: on TPU a
    scatter of [K, B, T, H] made XLA lay the pool out pages-major, and copy it back to the row-major layout the
    paged-attention kernel takes at every layer and step (a whole pool each); a slice written keeps the layout."""
    B, T = page_BT.shape
    x_XKH = x_BTKH.reshape(B * T, *x_BTKH.shape[2:])
    page_X, off_X = page_BT.reshape(-1), off_BT.reshape(-1)

    def one(i, pool):
        return jax.lax.dynamic_update_slice(pool, x_XKH[i][:, None, None, :], (0, page_X[i], off_X[i], 0))
    return jax.lax.fori_loop(0, B * T, one, pool_KPXH)
