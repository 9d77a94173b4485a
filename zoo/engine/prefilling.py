"""How prompts go into zoo-serve's engine's cache: a long prompt in pieces between decode chunks (`_fill`), a piece
from a position on (`_prefill_into`), and batched prefill (below), all through one program
(zoo.engine.programs.prefill, `_run_prefill`); each group's first tokens go out as soon as it is in.

Batched prefill: new prompts admitted together (a burst of requests, n completions of one)
are prefilled R at a time in one program (zoo.engine.programs.prefill) instead of one call each. XLA:CPU runs a
product of a few dozen rows at a fraction of its rate, so the gain is on short prompts (SmolLM2-135M float32,
2026-11-29, a busy host): eight prompts of 28 tokens admitted together took 0.76-0.80 s against 1.64-1.74 s one by
one; a model call on eight prompts of 32 tokens 85 ms a prompt against 169 ms alone, of 64 tokens 166 against 215,
of 128 tokens 336 against 377. Under steady load (python -m zoo.bench.serve, 8 and 32 streaming clients) prompts
rarely arrive together and tokens/s did not move.

A group of R rows (a power of two from FEWEST_ROWS to `prefill_rows`, of a bucket P up to LONGEST) runs once its
program is compiled. The first time a group of that shape appears, its prompts are prefilled one by one as before
and the program compiles in a thread of its own, so no decoding row waits for a compile; the next group of that
shape takes it (and jax's persistent compilation cache keeps it for the next start). `compile_batched(R, P, S)`
compiles one at once (tests, warm starts). Prompts that take a stored prefix (zoo.engine.pages) are batched too,
each from its own position over the first S slots of its pages (S a length bucket holding every one's prefix and
piece; a prompt asked again, a chat's next turn: at 32 streaming clients their prefills one by one were most of
the time to the first token); one prefilled in pieces goes alone. `Prefilling` is mixed into `Engine`, which
holds the cache, params, rows, buckets and `_first`."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np

from zoo.engine import pages
from zoo.engine.sequence import prefill_name

PREFILL_ROWS = 8  # the most prompts one batched prefill takes (zoo-serve --prefill-rows; 1: each alone)
FEWEST_ROWS = 4  # the fewest: two or three short prompts cost little more alone, and each R is a program to compile
LONGEST = 64  # the longest bucket batched: at 128 tokens eight prompts together cost 0.9x theirs alone


def _table_of(R: int, S: int) -> np.ndarray:
    return np.zeros((R, pages.pages_for(S)), np.int32)


def _dummies(R: int, P: int):
    """rows, ids, lengths, starts and own_from of R prompts of bucket P: the arguments a program is lowered with."""
    return np.zeros(R, np.int32), np.zeros((R, P), np.int32), np.ones(R, np.int32), np.zeros(R, np.int32), \
        np.zeros(R, np.int32)


def _shapes(tree):
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), tree)


class Prefilling:
    def _init_batched(self, prefill_rows: int) -> None:
        self.prefill_rows = prefill_rows
        self._batched: dict = {}  # (R, P, S) -> its compiled prefill program, once compiled
        self._batched_started: set = set()  # (R, P, S) compiles begun
        self.compiling: set = set()  # the names of the programs compiling in a thread now (zoo-serve's /health)
        self.batched = 0  # prompts prefilled in a batch of two or more

    def _group_rows(self, P: int) -> int:
        """The most prompts of bucket P one batched prefill takes (1: each alone)."""
        return min(self.prefill_rows, self.slots) if P <= LONGEST else 1

    def compile_batched(self, R: int, P: int, S: int | None = None):
        """The prefill program of R prompts of bucket P over S slots (None: P, prompts from position 0), compiled
        now (from the engine's current shapes)."""
        S = S or P
        if (R, P, S) not in self._batched:
            lowered = self._prefill.lower(_shapes(self.params), _shapes(self.cache), _table_of(R, S),
                                          _shapes(self.logits_BV), *_dummies(R, P),
                                          _shapes(self._lora(jnp.zeros(R, jnp.int32))))
            self._batched[(R, P, S)] = lowered.compile()
        return self._batched[(R, P, S)]

    def _compile_later(self, R: int, P: int, S: int) -> None:
        if (R, P, S) in self._batched_started:
            return
        self._batched_started.add((R, P, S))
        shapes = _shapes(self.params), _shapes(self.cache), _shapes(self.logits_BV)  # now, on the loop's thread
        lora = _shapes(self._lora(jnp.zeros(R, jnp.int32)))
        name = f"prefill of {R} prompts of up to {P} tokens" + (f" over {S} slots" if S > P else "")

        def compile_():
            try:
                self._batched[(R, P, S)] = self._prefill.lower(shapes[0], shapes[1], _table_of(R, S), shapes[2],
                                                               *_dummies(R, P), lora).compile()
            except Exception as e:  # noqa: BLE001 - those prompts go on being prefilled one by one
                self.say(f"zoo-serve: the {name} did not compile ({type(e).__name__}: {e}); they are prefilled one "
                         f"by one")
                return
            finally:
                self.compiling.discard(name)
            self.say(f"zoo-serve: compiled the {name} (first use)")
        self.compiling.add(name)
        threading.Thread(target=compile_, name=f"zoo-compile-prefill-{R}x{P}x{S}", daemon=True).start()

    def compile_stored_later(self) -> None:
        """Begin compiling, each in a thread, the batched prefills of the pieces after a stored prefix that a
        server's steady traffic runs (prompts asked again, a chat's next turn, a shared system prompt: pieces of up
        to 16 and 32 tokens over the first length bucket); the server answers meanwhile, those prompts prefilled
        one by one until their program is in."""
        S = self.length_buckets()[0]
        for P in (16, 32):
            R = FEWEST_ROWS
            while self.prefix_cache and R <= min(self.prefill_rows, self.slots) and S > P:
                self._compile_later(R, P, S)
                R *= 2

    def _prefill_new(self, items: list) -> None:
        """Prompts admitted into their rows (`items`: (row, prompt, m), each prefilled from position m on, its
        first m tokens' pages taken from the store): grouped by bucket and slots read, R at a time where the
        program of R is compiled, the rest one by one."""
        groups: dict[tuple[int, int], list] = {}
        for row, prompt, m in items:
            P = self.bucket(len(prompt) - m)
            S = P if m == 0 else self._length(m + P) if m + P <= self.max_len else 0  # 0: alone (moved back)
            groups.setdefault((P, S), []).append((row, prompt, m))
        for (P, S), group in groups.items():
            while group:
                R = 1
                while S and R * 2 <= min(len(group), self._group_rows(P)):
                    R *= 2
                R = R if R >= FEWEST_ROWS else 1
                if R > 1 and (R, P, S) not in self._batched:
                    self._compile_later(R, P, S)
                    R = next((r for r in (R // 2, R // 4) if r >= FEWEST_ROWS and (r, P, S) in self._batched), 1)
                take, group = group[:R], group[R:]
                if R == 1:
                    row, prompt, m = take[0]
                    self._prefill_into(row, prompt, m, len(prompt))
                else:
                    self._run_prefill(self._batched[(R, P, S)], [(row, prompt, m, m) for row, prompt, m in take], P, S)
                    self.batched += R
                for row, prompt, _ in take:
                    self.positions_B[row] = len(prompt)
                self._first()  # their first tokens out now, not after the groups behind them

    def _fill(self) -> None:
        """The next piece (`prefill_chunk` tokens) of the first prompt admitted to be prefilled a piece at a time:
        one piece between two decode chunks, so the rows decoding wait a piece, never a whole long prompt."""
        for row, m in list(self.filling.items())[:1]:
            seq = self.rows[row]
            if seq.cancelled():
                self._free(row)
                continue
            end = min(m + self.prefill_chunk, len(seq.prompt))
            self._prefill_into(row, seq.prompt, m, end)
            if end < len(seq.prompt):
                self.filling[row] = end
            else:
                del self.filling[row]
                self.positions_B[row] = len(seq.prompt)

    def _prefill_into(self, row: int, prompt: list[int], m: int, end: int) -> None:
        """prompt[m:end] into `row` from position m on, its slots before m holding prompt[:m] already (a shared
        prefix, an earlier piece); the logits of prompt[end - 1] into the row's."""
        P, own = self.bucket(end - m), m
        m = min(m, self.max_len - P)  # the prefill's slots stay in the window (a few tokens computed again)
        S = P if m == 0 else self._length(m + P)
        if ("prefill", P, S) not in self._compiled:
            self.say(f"zoo-serve: compiling the {prefill_name(P, S)} (first use)")
            self._compiled.add(("prefill", P, S))
        self._run_prefill(self._prefill, [(row, prompt[:end], m, own)], P, S)

    def _run_prefill(self, program, take: list, P: int, S: int) -> None:
        """`program` (the jitted prefill, or one compiled for these shapes) on `take`, (row, tokens, start, own_from)
        each: tokens[start:] (at most P) into the row from position `start` on, over its first S slots (the row's
        slots before `start` hold tokens[:start] already; those before own_from are not written); the logits of
        each one's last token into its row's."""
        ids = np.zeros((len(take), P), np.int32)
        for i, (row, tokens, start, _) in enumerate(take):
            ids[i, :len(tokens) - start] = tokens[start:]
            self.book.grow(row, len(tokens))
        rows, lengths, starts, own = (np.asarray(x, np.int32) for x in zip(*[
            (row, len(tokens) - start, start, own) for row, tokens, start, own in take]))
        self.cache, self.logits_BV = program(self.params, self.cache, self.book.rows_table(rows, pages.pages_for(S)),
                                             self.logits_BV, rows, ids, lengths, starts, own,
                                             self._lora(self.row_adapter[rows]))
        for row, tokens, _, _ in take:
            self.held[row] = list(tokens)
            self._store(row)
