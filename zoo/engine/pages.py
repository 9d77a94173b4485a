"""zoo-serve's KV cache in pages (vLLM's PagedAttention layout): one pool of PAGE-token pages per layer's keys and
values, `[pages, PAGE, KV heads, head dim]` (`[layers, pages, ...]` with the layers scanned), and a page table per
row naming the pages that hold its positions, PAGE at a time.

- **Memory is pages, not rows x window.** The pool holds `pages` pages whatever the rows and their window: a row
  takes pages as its positions reach them. A row admitted is promised the pages its prompt and `max_tokens` can
  fill (at most the window), so it never runs out mid-answer; a prompt that finds no room waits in the queue
  until rows finish (or the prefixes cached by free rows are evicted, least recently used first).
- **Prefixes are shared, not copied.** A prompt whose leading tokens a row holds takes that row's whole pages of
  them by reference (a count per page): a chat's system prompt is held once however many rows use it. Only whole
  pages are shared, and a row only writes at its own position on, past the shared pages, so a shared page is
  never written; the part of the prefix in a partial page is prefilled again (fewer than PAGE tokens).
- **A free row keeps its pages** (its prefix, for the next prompt that shares it) until it takes another prompt
  or is evicted to make room.
- Page 0 is scratch: a table entry no page was taken for points there, so a step's writes past a row's pages
  (the rest of a chunk after its end, a free row's nothing) land where nobody reads.

The programs (zoo.engine.programs) gather a call's rows' pages into the dense `[B, S, KV heads, head dim]` view
zoo.nn.attention reads and writes (the same as the rows' first S slots of a dense cache), and scatter back only
the pages the call wrote: a decode chunk's K steps touch ceil(K / PAGE) + 1 pages a row, not its S slots.
"""

from __future__ import annotations

import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from zoo.errors import ArgumentError

PAGE = 16  # tokens a page holds (vLLM's default block size)


def pool_of(cache, ax: int, pages: int):
    """The page pool shaped like a dense cache `cache` (arrays or ShapeDtypeStructs; each row-wise leaf's axes ax
    and ax + 1 are rows and slots): those two axes become (pages, PAGE)."""
    def one(c):
        if c.ndim <= ax:
            return c
        shape = c.shape[:ax] + (pages, PAGE) + c.shape[ax + 2:]
        if isinstance(c, jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct(shape, c.dtype, sharding=getattr(c, "sharding", None))
        return jnp.zeros(shape, c.dtype)
    return jax.tree.map(one, cache)


def gather(pool, table_BN, ax: int):
    """The rows' dense view of their pages: each row-wise leaf [..., B, N * PAGE, ...] (table_BN: each row's first
    N pages)."""
    B, N = table_BN.shape

    def one(c):
        if c.ndim <= ax:
            return c
        g = c.at[(slice(None),) * ax + (table_BN.reshape(-1),)].get(mode="promise_in_bounds")  # no bounds select
        return g.reshape(c.shape[:ax] + (B, N * PAGE) + c.shape[ax + 2:])
    return jax.tree.map(one, pool)


def scatter(pool, view, table_BN, first_B, W: int, ax: int):
    """The pool with each row's W pages from page first_B (a page index into its table) written back from its
    dense view (from `gather`, then written by the model); a row with first_B < 0 writes only the scratch page.
    Leaves that are not per row (a shared index) are the view's."""
    B, N = table_BN.shape
    idx_BW = jnp.clip(jnp.maximum(first_B, 0)[:, None] + jnp.arange(W)[None, :], 0, N - 1)
    dst_BW = jnp.where(first_B[:, None] >= 0, jnp.take_along_axis(table_BN, idx_BW, axis=1), 0)

    def one(c, v):
        if c.ndim <= ax:
            return v
        lead = (slice(None),) * ax
        pages = v.reshape(v.shape[:ax] + (B, N, PAGE) + v.shape[ax + 2:])
        sel = pages[lead + (jnp.arange(B)[:, None], idx_BW)]  # [..., B, W, PAGE, ...]
        sel = sel.reshape(c.shape[:ax] + (B * W, PAGE) + c.shape[ax + 2:])
        return c.at[lead + (dst_BW.reshape(-1),)].set(sel.astype(c.dtype), mode="promise_in_bounds")
    return jax.tree.map(one, pool, view)


def pages_for(n: int) -> int:
    """Pages holding n tokens."""
    return -(-n // PAGE)


class Pages:
    """The host's book of the pool: free pages, each page's count of rows holding it, each row's pages (its table)
    and the pages promised to running rows. Every call is made on the engine's thread."""

    def __init__(self, rows: int, max_len: int, pages: int):
        if (pages - 1) * PAGE < max_len:
            raise ArgumentError(f"a KV cache of {pages - 1} pages of {PAGE} tokens holds {(pages - 1) * PAGE} tokens, "
                                f"fewer than one sequence of the context's {max_len}; give it at least "
                                f"{max_len} tokens (zoo-serve --kv-cache-tokens)")
        self.pages, self.width = pages, pages_for(max_len)
        self.free = list(range(pages - 1, 0, -1))  # page 0: scratch
        self.refs = np.zeros(pages, np.int32)
        self.owned: list[list[int]] = [[] for _ in range(rows)]
        self.promised = [0] * rows  # pages a running row may still take
        self.last_used = [0.0] * rows
        self.table = np.zeros((rows, self.width), np.int32)
        self.evicted = 0  # free rows' cached prefixes dropped to make room

    def in_use(self) -> int:
        return self.pages - 1 - len(self.free)

    def room(self) -> int:
        return len(self.free) - sum(self.promised)

    def _release(self, row: int) -> None:
        for p in self.owned[row]:
            self.refs[p] -= 1
            if self.refs[p] == 0:
                self.free.append(p)
        self.owned[row] = []
        self.table[row] = 0

    def take(self, row: int, donor: int, shared: int, tokens: int, evictable, held: list) -> bool:
        """Row `row` starts a sequence of at most `tokens` tokens whose first `shared` pages are `donor`'s (-1:
        none): it holds those, lets go of its own, and is promised the rest, evicting the cached prefixes of free
        rows (`evictable`: those rows, least recently used first; `held[r]` emptied for each) while the pool is
        short. False, holding nothing, when even then there is no room (the sequence waits)."""
        keep = list(self.owned[donor][:shared]) if donor >= 0 else []
        for p in keep:
            self.refs[p] += 1
        self._release(row)
        need = pages_for(tokens) - len(keep)
        for r in sorted(evictable, key=lambda r: self.last_used[r]):
            if self.room() >= need:
                break
            if r != row and self.owned[r]:
                self._release(r)
                held[r] = []
                self.evicted += 1
        if self.room() < need:
            self.owned[row] = keep
            self._release(row)
            return False
        self.owned[row] = keep
        self.table[row, :len(keep)] = keep
        self.promised[row] = need
        return True

    def grow(self, row: int, tokens: int) -> None:
        """Row `row`'s pages cover its first `tokens` positions (out of its promise; past it, its writes go to the
        scratch page)."""
        want = min(pages_for(tokens), self.width)
        while len(self.owned[row]) < want and self.promised[row] > 0:
            p = self.free.pop()
            self.refs[p] = 1
            self.table[row, len(self.owned[row])] = p
            self.owned[row].append(p)
            self.promised[row] -= 1

    def done(self, row: int) -> None:
        """Row `row`'s sequence ended: its pages stay (a prefix for the next prompt), its promise goes."""
        self.promised[row] = 0
        self.last_used[row] = time.monotonic()

    def rows_table(self, rows, N: int) -> np.ndarray:
        """The table's first N pages of these rows (a slice or a list of rows), a copy: the call it goes to may
        still read it after the host has grown the table."""
        return self.table[rows, :N].copy()


def default_pages(slots: int, max_len: int) -> int:
    """A pool as large as a dense cache of `slots` rows of `max_len` slots, and the scratch page."""
    return slots * pages_for(max_len) + 1


def pages_of_tokens(tokens: int) -> int:
    """A pool holding `tokens` tokens, and the scratch page."""
    return math.ceil(tokens / PAGE) + 1
