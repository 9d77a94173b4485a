"""A decoding cache held in pages (vLLM's PagedAttention layout), read and written by `Attention` in place.

Under `paged(table_BN)` each self-attention layer's "cache" variables `cached_key` / `cached_value` are a pool
of pages, `[pages, PAGE, K, H]`, shared by every row, instead of a dense `[B, S, K, H]` per row: row b's
position p lies in page `table_BN[b, p // PAGE]` at offset `p % PAGE`. A decoding step writes its new keys and
values into their pages (a scatter of B x T entries into the pool, which a donated or loop-carried buffer takes in
place) and attends over the row's first N pages, gathered layer by layer where the attention reads them: no
whole-model dense view is built, and nothing is copied back (zoo.engine.programs.decode_chunk). A negative
position (a free row, left padding) writes to page 0, which the engine keeps as scratch (zoo.engine.pages).
"""

from __future__ import annotations

import contextlib
import contextvars

import jax.numpy as jnp

_TABLE: contextvars.ContextVar = contextvars.ContextVar("zoo_paged_cache", default=None)


@contextlib.contextmanager
def paged(table_BN):
    """Within it (while a model is traced), decoding reads and writes its cache as pages of a pool through
    table_BN ([B, N] int32: each row's first N page ids)."""
    token = _TABLE.set(table_BN)
    try:
        yield
    finally:
        _TABLE.reset(token)


def table():
    """The page table the model is traced under, or None (a dense cache)."""
    return _TABLE.get()


def write_read(key, value, k_BTKH, v_BTKH, positions_BT, table_BN):
    """Each row's keys and values written at its positions' pages and offsets (a negative position: page 0,
    scratch), the pools `key` / `value` ([P, PAGE, K, H] flax variables) updated; returns the rows' views of
    their first N pages, [B, N * PAGE, K, H] each, and mask_B1TS (a query sees the slots at or before its
    position)."""
    B, N = table_BN.shape
    PAGE = key.value.shape[1]
    page_BT = jnp.where(positions_BT >= 0, jnp.take_along_axis(table_BN, jnp.maximum(positions_BT, 0) // PAGE,
                                                                axis=1), 0)
    off_BT = jnp.where(positions_BT >= 0, positions_BT % PAGE, 0)
    for var, x_BTKH in ((key, k_BTKH), (value, v_BTKH)):
        var.value = var.value.at[page_BT, off_BT].set(x_BTKH.astype(var.value.dtype), mode="promise_in_bounds")
    views = [v.value.at[table_BN.reshape(-1)].get(mode="promise_in_bounds").reshape(B, N * PAGE,
                                                                                    *v.value.shape[2:])
             for v in (key, value)]
    mask_B1TS = (jnp.arange(N * PAGE)[None, None, :] <= positions_BT[:, :, None])[:, None]
    return views[0], views[1], mask_B1TS
