"""zoo-serve's KV cache in pages (vLLM's PagedAttention layout): one pool of PAGE-token pages per layer's keys and
values, `[pages, PAGE, KV heads, head dim]` (`[layers, pages, ...]` with the layers scanned), and a page table per
row naming the pages that hold its positions, PAGE at a time.

- **Memory is pages, not rows x window.** The pool holds `pages` pages whatever the rows and their window: a row
  takes pages as its positions reach them. A row admitted is promised the pages its prompt and `max_tokens` can
  fill (at most the window), so it never runs out mid-answer; a prompt that finds no room waits in the queue
  until rows finish (or idle stored pages are taken back, least recently used first).
- **Prefixes are shared, not copied.** Every whole page a row has filled (its prompt once prefilled, the tokens
  it decoded once it ends) goes into a prefix store, a trie of pages keyed by their tokens: a prompt whose leading
  tokens the store holds takes those pages by reference (a count per page), so a chat's system prompt, or a
  prompt asked again, is held and prefilled once however many rows use it. Only whole pages are shared, and a row
  only writes at its own position on, past the shared pages, so a shared page is never written; the part of the
  prefix in a partial page is prefilled again (fewer than PAGE tokens).
- **An ended row's stored pages stay** in the store, idle, until a row needs a page and no page is free: then
  the least recently used idle page is taken back (vLLM's automatic prefix caching).
- Page 0 is scratch: a table entry no page was taken for points there, so a step's writes past a row's pages
  (the rest of a chunk after its end, a free row's nothing) land where nobody reads.

The engine's programs (zoo.engine.programs: a decode chunk, a prefill) read and write the pool in place
(zoo.nn.paged_cache: each layer writes its new tokens into their pages and gathers its rows' pages where its
attention reads them).
"""

from __future__ import annotations

import collections
import math

import jax
import jax.numpy as jnp
import numpy as np

from zoo.errors import ArgumentError

PAGE = 16  # tokens a page holds (vLLM's default block size)


def pool_of(cache, ax: int, pages: int, combined: bool = False):
    """The page pool shaped like a dense cache `cache` (arrays or ShapeDtypeStructs; each row-wise leaf's axes ax
    and ax + 1 are rows and slots): those two axes become (pages, PAGE). `combined` (a paged-attention kernel's
    layout, zoo.nn.paged_kernels): each layer's keys and values one pool in `cached_key`, [pages, PAGE, 2K, H],
    and `cached_value` empty."""
    def one(path, c):
        if c.ndim <= ax:
            return c
        rest = c.shape[ax + 2:]
        name = getattr(path[-1], "key", None)
        if combined and name == "cached_key":
            rest = (2 * rest[0],) + rest[1:]
        shape = c.shape[:ax] + ((0,) if combined and name == "cached_value" else (pages, PAGE) + rest)
        if isinstance(c, jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct(shape, c.dtype, sharding=getattr(c, "sharding", None))
        return jnp.zeros(shape, c.dtype)
    return jax.tree_util.tree_map_with_path(one, cache)


def pages_for(n: int) -> int:
    """Pages holding n tokens."""
    return -(-n // PAGE)


class Pages:
    """The host's book of the pool: free pages, each page's count of rows holding it, each row's pages (its table),
    the pages promised to running rows, and the prefix store: a trie of whole pages of tokens (each page keyed by
    the node of the page before it, the adapter and its PAGE tokens: exact, no hash to collide) naming the page
    that holds their keys and values. A page in the store that no row holds is idle: kept for the next prompt that
    starts with its tokens, and taken back, least recently used first, when a row needs a page and none is free
    (vLLM's automatic prefix caching). Every call is made on the engine's thread."""

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
        self.table = np.zeros((rows, self.width), np.int32)
        self.nodes: dict[tuple, int] = {}  # (node of the page before, 0 at the start; adapter; tokens) -> page
        self.node_of: dict[int, tuple[int, tuple]] = {}  # a stored page -> (its node number, its key)
        self.idle: collections.OrderedDict = collections.OrderedDict()  # stored pages no row holds, oldest first
        self._serial = 0
        self.evicted = 0  # idle stored pages taken back for rows to write

    def in_use(self) -> int:
        """Pages held by rows or kept in the prefix store."""
        return self.pages - 1 - len(self.free)

    def held(self) -> int:
        """Pages held by rows (running, or prefilling)."""
        return self.in_use() - len(self.idle)

    def room(self) -> int:
        """Pages a new sequence may be promised: the free ones and the idle stored ones, less those promised."""
        return len(self.free) + len(self.idle) - sum(self.promised)

    def lookup(self, tokens: list[int], adapter: int = 0) -> list[int]:
        """The stored pages holding the most whole leading pages of `tokens` (computed under `adapter`)."""
        out, node = [], 0
        for j in range(len(tokens) // PAGE):
            p = self.nodes.get((node, adapter, tuple(tokens[j * PAGE:(j + 1) * PAGE])))
            if p is None:
                break
            out.append(p)
            node = self.node_of[p][0]
        return out

    def store(self, row: int, tokens: list[int], adapter: int = 0) -> None:
        """Row `row`'s whole pages of `tokens` (what its first positions hold) into the prefix store; a page whose
        tokens another page holds already stays the row's alone. A page of the row's that is stored is stored under
        these very tokens (the row took it by them from `lookup`, or stored it itself when it held fewer of them)."""
        node = 0
        for j in range(min(len(tokens) // PAGE, len(self.owned[row]))):
            p, key = self.owned[row][j], (node, adapter, tuple(tokens[j * PAGE:(j + 1) * PAGE]))
            q = self.nodes.get(key)
            if q is None:
                self._serial += 1
                self.nodes[key], self.node_of[p], q = p, (self._serial, key), p
            node = self.node_of[q][0]

    def forget(self, adapter: int) -> None:
        """Drop the stored pages computed under `adapter` (its slot now holds another, or none)."""
        for p in [p for p, (_, key) in self.node_of.items() if key[1] == adapter]:
            self._unstore(p)
            if p in self.idle:
                del self.idle[p]
                self.free.append(p)

    def _unstore(self, p: int) -> None:
        _, key = self.node_of.pop(p)
        del self.nodes[key]

    def _release(self, row: int) -> None:
        for p in reversed(self.owned[row]):  # last to first: a stored sequence's tail goes idle (and back) first,
            # so what is taken back leaves its prefix reachable (as vLLM frees a request's blocks)
            self.refs[p] -= 1
            if self.refs[p] == 0:
                if p in self.node_of:
                    self.idle[p] = None  # the most recently used
                else:
                    self.free.append(p)
        self.owned[row] = []
        self.table[row] = 0

    def _new_page(self) -> int:
        """A page for a row to write: a free one, else the least recently used idle stored one."""
        if self.free:
            return self.free.pop()
        p, _ = self.idle.popitem(last=False)
        self._unstore(p)  # pages stored after it keep their keys, unreachable now, and go idle in their turn
        self.evicted += 1
        return p

    def take(self, row: int, keep: list[int], tokens: int) -> bool:
        """Row `row` starts a sequence of at most `tokens` tokens whose first pages are `keep` (stored pages, from
        `lookup`): it holds those and is promised the rest. False, holding nothing, when the free and idle pages
        are too few (the sequence waits)."""
        self._release(row)
        for p in keep:
            self.idle.pop(p, None)
            self.refs[p] += 1
        self.owned[row] = list(keep)
        need = pages_for(tokens) - len(keep)
        if self.room() < need:
            self._release(row)
            return False
        self.table[row, :len(keep)] = keep
        self.promised[row] = need
        return True

    def grow(self, row: int, tokens: int) -> None:
        """Row `row`'s pages cover its first `tokens` positions (out of its promise; past it, its writes go to the
        scratch page)."""
        want = min(pages_for(tokens), self.width)
        while len(self.owned[row]) < want and self.promised[row] > 0:
            p = self._new_page()
            self.refs[p] = 1
            self.table[row, len(self.owned[row])] = p
            self.owned[row].append(p)
            self.promised[row] -= 1

    def done(self, row: int) -> None:
        """Row `row`'s sequence ended: its pages go (those in the prefix store stay there, idle), its promise
        too."""
        self.promised[row] = 0
        self._release(row)

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
