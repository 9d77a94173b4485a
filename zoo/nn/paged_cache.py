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
"""

from __future__ import annotations

import contextlib
import contextvars

import jax.numpy as jnp

_TABLE: contextvars.ContextVar = contextvars.ContextVar("zoo_paged_cache", default=None)


@contextlib.contextmanager
def paged(table_BN, write_from_B=None):
    """Within it (while a model is traced), decoding reads and writes its cache as pages of a pool through
    table_BN ([B, N] int32: each row's first N page ids); `write_from_B` ([B], None: 0): a row's positions before
    it are read from its pages, not written."""
    token = _TABLE.set((table_BN, write_from_B))
    try:
        yield
    finally:
        _TABLE.reset(token)


def current():
    """(table_BN, write_from_B) of the `paged` block the model is traced under, or None (a dense cache)."""
    return _TABLE.get()


def write_read(key, value, k_BTKH, v_BTKH, positions_BT, table_BN, write_from_B=None):
    """Each row's keys and values written at its positions' pages and offsets (a negative position, or one before
    the row's write_from_B: page 0, scratch), the pools `key` / `value` ([P, PAGE, K, H] flax variables) updated;
    returns the rows' views of their first N pages, [B, N * PAGE, K, H] each, and mask_B1TS (a query sees the
    slots at or before its position)."""
    B, N = table_BN.shape
    PAGE = key.value.shape[1]
    writes_BT = positions_BT >= (0 if write_from_B is None else jnp.maximum(write_from_B, 0)[:, None])
    page_BT = jnp.where(writes_BT, jnp.take_along_axis(table_BN, jnp.maximum(positions_BT, 0) // PAGE, axis=1), 0)
    off_BT = jnp.where(writes_BT, positions_BT % PAGE, 0)
    for var, x_BTKH in ((key, k_BTKH), (value, v_BTKH)):
        var.value = var.value.at[page_BT, off_BT].set(x_BTKH.astype(var.value.dtype), mode="promise_in_bounds")
    views = [v.value.at[table_BN.reshape(-1)].get(mode="promise_in_bounds").reshape(B, N * PAGE,
                                                                                    *v.value.shape[2:])
             for v in (key, value)]
    mask_B1TS = (jnp.arange(N * PAGE)[None, None, :] <= positions_BT[:, :, None])[:, None]
    return views[0], views[1], mask_B1TS
