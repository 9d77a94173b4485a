"""Which programs the serving engine (zoo.engine.batching.Engine) compiles, and compiling them before the first
request: a prefill per prompt-length bucket (powers of two from 16 up to the cache's length) and per later piece of
a long prompt, and a decode per number of rows (powers of two up to the slots) and cache length (powers of two from
128), the first WARM_LENGTHS lengths warmed, the longer ones compiled when a row first reaches them."""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from zoo.engine.pages import pages_for

from zoo.engine.sequence import decode_name, powers, prefill_name

WARM_LENGTHS = 2  # length buckets compiled before the first request (128 and 256 slots)


class Warming:
    """The Engine's program buckets and `warm` (a mixin: it reads the Engine's max_len, slots, chunk,
    prefill_chunk, params, cache and programs)."""

    def buckets(self) -> list[int]:
        """The prompt-length buckets a prefill compiles for: powers of two from 16 to the cache's length."""
        return powers(16, self.max_len)

    def bucket(self, n: int) -> int:
        return next(b for b in self.buckets() if b >= n)

    def row_buckets(self) -> list[int]:
        """The numbers of rows a decode chunk compiles for: powers of two up to the slots, and the slots."""
        return powers(1, self.slots)

    def length_buckets(self) -> list[int]:
        """The cache lengths a decode chunk compiles for: powers of two from 128 to the cache's length, and it, and
        from 1,024 on the lengths halfway between (1,536, 3,072, ...): a long row's step reads the keys and values
        of at most a third more slots than it holds, not twice as many (at 1,050 tokens, 1,536 slots, not 2,048;
        reading them is most of a long row's step)."""
        out = powers(128, self.max_len)
        return sorted(set(out) | {b * 3 // 2 for b in out if 1024 <= b and b * 3 // 2 < self.max_len})

    def warm_plan(self) -> list[tuple]:
        """What `warm` compiles: ("prefill", P, S) per prompt bucket up to `prefill_chunk` (P = S: a prompt's first
        piece) and the pieces after it (P the last of those buckets, S each longer length), the piece of up to 16
        tokens after a stored prefix over the first length bucket (a prompt asked again, a short shared system
        prompt; with the prefix cache on), then ("decode", B, K, L) for each row bucket (one program runs a chunk
        or a single step: a streaming row),
        at the first WARM_LENGTHS length buckets (the lengths a chat's requests reach); a longer length compiles
        when a row first reaches it, said on the log."""
        lengths = self.length_buckets()[:WARM_LENGTHS]
        steps = [self.chunk]
        first = [P for P in self.buckets() if P <= self.prefill_chunk] or self.buckets()[:1]
        later = [S for S in self.length_buckets() if S > first[-1]]  # a long prompt's later pieces
        stored = [("prefill", 16, lengths[0])] if self.prefix_cache and lengths[0] > 16 and \
            ("prefill", 16, lengths[0]) not in [("prefill", first[-1], S) for S in later] else []
        return ([("prefill", P, P) for P in first] + [("prefill", first[-1], S) for S in later] + stored
                + [("decode", B, K, L) for L in lengths for B in self.row_buckets() for K in steps])

    def programs(self) -> int:
        """How many programs `warm` compiles."""
        return len(self.warm_plan())

    def warm(self, say: Callable | None = None) -> float:
        """Compile the programs of `warm_plan` now, saying each (`say(line)`, e.g. print) as it starts; returns
        the seconds it took."""
        t, plan = time.perf_counter(), self.warm_plan()
        for i, (kind, *shape) in enumerate(plan):
            if say is not None:
                say(f"compiling {i + 1}/{len(plan)}: " + (prefill_name(*shape) if kind == "prefill"
                                                          else decode_name(*shape)))
            if kind == "prefill":
                table = np.zeros((1, pages_for(shape[1])), np.int32)  # the scratch page: nothing kept
                one = np.zeros(1, np.int32)  # row 0, from position 0
                self.cache, self.logits_BV = self._prefill(self.params, self.cache, table, self.logits_BV, one,
                                                           np.zeros((1, shape[0]), np.int32), one + 1, one, one,
                                                           self._lora(one))
                self.held[0] = []
                self._compiled.add(("prefill", *shape))
            else:
                self._run_chunk(*shape)
            if kind == "decode":
                self._compiled.add(tuple(shape))
        for R in self.row_buckets():  # the first tokens' sampling (Engine._first): a small program per row bucket
            np.asarray(self._first_tokens(self.logits_BV, np.zeros(R, np.int32), np.zeros((R, 2), np.uint32),
                                          np.zeros(R, np.float32), np.zeros(R, np.int32), np.ones(R, np.float32)))
        return time.perf_counter() - t
