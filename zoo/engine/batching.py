"""The serving engine: one decoder, its KV cache (pages shared by `slots` rows), and a loop that decodes every
active row together, admitting waiting requests into free rows between decode chunks (continuous batching, as vLLM
and JetStream do).

Each row is one sequence (a request's completion; n completions are n rows). The KV cache is a pool of pages
(zoo.engine.pages: PAGE tokens each, a page table per row, memory sized by `kv_pages`, not rows x window). A row
decodes at its own positions: its prompt is prefilled into its pages, then each chunk of `chunk` decode steps runs
all rows in one jitted loop over their pages, every row sampling with its own temperature, top-k, top-p and key
(folded from its seed and its step, so a row's tokens do not depend on the rows beside it). Between chunks the
host hands each row's new tokens to its request (streaming), retires rows that ended (end-of-text or end-of-turn,
max_tokens, a stop string, a client gone) and admits waiting requests into the freed rows: each admitted row is
promised the pages its prompt and max_tokens can fill, and a request the pool has no room for waits (in
`deferred`) until rows finish. A request arriving while others decode waits at most one chunk, never for their
whole decode.

Prefix sharing: every row remembers the tokens whose keys and values its pages hold (its prompt, then each token it
decoded), and puts its whole pages of them in the pool's prefix store (zoo.engine.pages: its prompt's once
prefilled, the rest when it ends). A new prompt whose first SHARED_MIN or more tokens the store holds (a chat's
shared system prompt, the turns before the last one, a prompt asked again) holds those pages too (by reference:
nothing copied, the pages counted) and prefills only the rest, from its position on, attending over the shared
pages. Stored pages no row holds stay until a row needs a page and none is free (the least recently used go
first). `prefix_cache=False` (zoo-serve --no-prefix-cache) prefills every prompt whole.

Chunked prefill: a prompt with more than `prefill_chunk` tokens left to prefill, admitted while other rows decode,
is prefilled a piece of `prefill_chunk` tokens at a time, one piece between two decode chunks (each piece from its
position on, over the pieces before it), so the rows decoding wait one piece for it, never its whole prompt; it
decodes once its last piece is in. Admitted with nobody decoding, its pieces are prefilled at once, one after
another (pieces, not one bucket: a 1,060-token prompt computes 512 + 512 + 64 positions, not 2,048).

Batched prefill: new prompts admitted together, each prefilled in one piece (from position 0, or from the end of
the stored prefix it took), go R at a time into one program (zoo.engine.prefilling: a burst of short prompts
costs half as much; its programs compile in a thread of their own the first time, the prompts prefilled one by
one meanwhile).

Compiled programs: a prefill per prompt-length bucket up to `prefill_chunk` (powers of two from 16; a prompt's
first piece attends its own bucket's slots) and one of a whole piece per longer length (a later piece attends the
slots before it and its own), and a decode for each number of rows (powers of two up to the slots: the smallest
holding every active row runs, so one client pays for one row) and length (the rows' first L slots, L a length
bucket holding every position the steps write, zoo.engine.warming: a step reads the keys and values its rows hold,
not the window). A decode program runs a chunk of steps or stops after one (its step count is traced): one
step while a row's client streams, so each token goes out as it is sampled. A new row's first token is sampled
from its prefill's logits as soon as its prompt is in and goes out at once (`_first`), not after the next decode
call, which feeds it. The
layers run one after another (Engine's `scan_layers`). `warm()` compiles the prefills and the decodes of the first
two lengths before the first request, saying each; a longer length compiles when a row first reaches it (said on
stderr; jax's persistent compilation cache, which zoo's commands turn on, keeps every program for the next start).

Structured output: a row with a grammar (Sequence.grammar, a zoo.infer.grammar.Matcher of its JSON schema) takes
its next token among those its grammar allows: each decode call passes a bitmask [B, ceil(V / 32)] (all ones for a
row without a grammar) that the jitted sampler applies before sampling, so rows with and without one share a
batch and one program. A matcher advances on the host, token by token, so while a grammar row decodes each call is
one step; the row ends when its grammar admits nothing more (or at end-of-text, allowed only once it accepts).

Scoring (`/v1/completions` with logprobs; zoo.engine.scoring) is cut into batches of at most `max_len` padded
tokens (no more work than one full prefill), each compiled in the request's thread (not this loop's) and run as
one job between two decode chunks: a long scoring request makes the rows decoding beside it wait one batch at a
time, never for its whole length, and two scoring requests take turns.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import queue
import sys
import threading
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from zoo.errors import ArgumentError
from zoo.infer.grammar import words
from zoo.infer.sample import stop_ids
from zoo.engine import pages, programs
from zoo.engine.prefilling import PREFILL_ROWS, Prefilling
from zoo.engine.programs import decode_chunk
from zoo.engine.scoring import Scoring
from zoo.engine.sharing import SHARED_MIN, Sharing
from zoo.engine.sequence import Sequence, decode_name
from zoo.engine.warming import Warming
from zoo.nn import paged_kernels

PREFILL_CHUNK = 512  # a longer prompt admitted while rows decode is prefilled this many tokens between two chunks


class Engine(Scoring, Prefilling, Warming, Sharing):
    """The decoder behind the server (see the module's docstring). `lm` is a zoo.Pretrained decoder; `slots` rows
    decode together; `max_len` is the cache's length (at most the model's window); `chunk` decode steps run between
    two admissions; `prefix_cache`: prompts take the leading tokens a row holds (see the module's docstring);
    `prefill_chunk`: the piece a long prompt admitted while rows decode is prefilled in; `prefill_rows`: the most
    new prompts one prefill takes (zoo.engine.prefilling; 1: each alone). `scan_layers`: the layers
    as one scan (each program compiles one layer: a start-up 2-3x faster) instead of one after another (each decoding
    step 1.3-1.5x faster: a scan copies every layer's weights out of their stack at every step,
    zoo.infer.sample.unscanned). `adapters`: a zoo.engine.adapters.AdapterTable, each Sequence's `adapter` its slot.
    `kv_pages`: the KV cache's pages (zoo.engine.pages; default: as many as `slots` rows of `max_len` need)."""

    def __init__(self, lm, *, slots: int = 8, max_len: int | None = None, chunk: int = 8, max_queue: int = 64,
                 prefix_cache: bool = True, prefill_chunk: int = PREFILL_CHUNK, scan_layers: bool = False,
                 prefill_rows: int = PREFILL_ROWS, adapters=None, kv_pages: int | None = None,
                 paged_kernel: str = "auto"):
        if adapters is not None and scan_layers:  # the adapter table names the looped layers (h_0, h_1, ...)
            raise ArgumentError("adapters per request decode with the layers looped; leave out --scan-layers")
        self.lm, self.slots, self.chunk, self.max_queue = lm, slots, chunk, max_queue
        self.prefix_cache, self.prefill_chunk = prefix_cache, prefill_chunk
        self.filling: dict[int, int] = {}  # row -> its prompt's tokens in the cache so far, while prefilled in pieces
        self.held: list[list[int]] = [[] for _ in range(slots)]  # the tokens whose keys and values a row's slots hold
        self.reused = 0  # prompt tokens taken from the cache instead of prefilled
        self.max_len = min(max_len or lm.config.window, lm.config.window)
        # looped layers by default (see Engine's docstring); adapters per request find their Einsums apart
        self.model, self.params = lm.decoding(scan=scan_layers, fuse=adapters is None)
        self.vocab = lm.tokenizer.n_vocab
        self.eos = np.asarray(stop_ids(lm.tokenizer), np.int32)
        self.waiting: queue.Queue = queue.Queue()
        self.jobs: queue.Queue = queue.Queue()  # (fn, future): other work for the device (scoring), one per chunk
        self.scored = 0  # scoring batches run
        self._wake = threading.Event()  # set when a sequence or a job arrives: the idle loop waits on it
        self._scorers: dict = {}  # (B, T, top) -> a compiled scoring program
        self._compiling = threading.Lock()
        self.rows: list[Sequence | None] = [None] * slots
        self.batches = 0  # decode chunks run (each one program call over every active row)
        self.admitted = 0  # sequences prefilled into a row
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None
        dense = jax.eval_shape(lambda: self.model.init(jax.random.PRNGKey(0),
                                                       jnp.zeros((slots, self.max_len), jnp.int32), decode=True))["cache"]
        self.batch_axis = 1 if self.model.cfg.scan_layers else 0  # scanned stacks put the layer axis first
        kv_pages = kv_pages or pages.default_pages(slots, self.max_len)
        self.book = pages.Pages(slots, self.max_len, kv_pages)  # which pages each row holds (zoo.engine.pages)
        # a paged-attention kernel where one takes the model (TPU), the pool laid out for it (zoo.nn.paged_kernels)
        self.kernel, why = paged_kernels.for_model(paged_kernel, self.model.cfg, self.model.cfg.dtype)
        if why and paged_kernel != "auto":
            raise ArgumentError(f"--paged-kernel {paged_kernel}: {why}")
        self.cache = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype),
                                  pages.pool_of(nn.unbox(dense), self.batch_axis, kv_pages, bool(self.kernel)))
        self.deferred: collections.deque = collections.deque()  # taken from the queue, waiting for pages
        self.logits_BV = jnp.zeros((slots, self.model.cfg.vocab_size), jnp.float32)
        self.positions_B = np.full(slots, -1, np.int32)  # the next token's position; -1: the row is free
        self.adapters, self.row_adapter = adapters, np.zeros(slots, np.int32)  # each row's adapter slot (0: none)
        self._lora = (lambda index: None) if adapters is None else adapters.args  # what the programs take
        self._prefill = jax.jit(functools.partial(programs.prefill, self.model, kernel=self.kernel),
                                donate_argnums=(1, 3))
        self._init_batched(prefill_rows)
        self._decode = jax.jit(functools.partial(decode_chunk, self.model, self.vocab, self.batch_axis,
                                                 kernel=self.kernel),
                               static_argnames=("B", "K", "L"), donate_argnums=(1, 3))
        self._first_tokens = jax.jit(functools.partial(programs.first_tokens, self.vocab))
        self.forced_B = np.full(slots, -1, np.int32)  # a row's first token, sampled at its prefill; -1: none
        self._compiled: set = set()  # (B, K, L) of the decode programs compiled
        self.say: Callable = lambda line: print(line, file=sys.stderr, flush=True)  # a later compile, said
        self._score = jax.jit(self._score_fn, static_argnames=("top",))

    # ---- the loop --------------------------------------------------------------------------------------------
    def submit(self, seqs: list[Sequence]) -> bool:
        """Queue a request's sequences (all or none); False when the queue is full (the server answers 429)."""
        if self.waiting.qsize() + len(seqs) > self.max_queue:
            return False
        for s in seqs:
            self.waiting.put(s)
        self._wake.set()
        return True

    def job(self, fn) -> concurrent.futures.Future:
        """fn() on the engine's thread, between two decode chunks (one job per chunk); its future's result."""
        future = concurrent.futures.Future()
        if self.stopping.is_set():
            future.set_exception(RuntimeError("the server is stopping"))
            return future
        self.jobs.put((fn, future))
        self._wake.set()
        return future

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="zoo-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=1.5)
        while not self.jobs.empty():  # their requests answer 503 rather than wait forever
            self.jobs.get()[1].set_exception(RuntimeError("the server is stopping"))

    def active(self) -> int:
        return sum(r is not None for r in self.rows)

    def _loop(self) -> None:
        while not self.stopping.is_set():
            self._wake.clear()  # before looking: work that arrives after this wakes the wait below
            if not self.jobs.empty():  # one job, then a chunk: decoding rows wait one job at most
                fn, future = self.jobs.get()
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn())
                    except BaseException as e:  # noqa: BLE001 - handed to the request that asked
                        future.set_exception(e)
            self._admit()
            if not self.active():
                if self.jobs.empty():
                    self._wake.wait(0.05)  # idle: wait for work, without spinning
                continue
            self._fill()
            self._first()
            if not self.decoding():  # rows still prefilling their prompts, none decoding yet
                continue
            toks_BK = self._run_chunk()
            self._hand_out(toks_BK)

    def run(self, seqs: list[Sequence]) -> None:
        """Decode `seqs` to their ends on the calling thread, the loop's steps without its thread (Pretrained.generate
        with a json_schema); their `emit` gets the tokens."""
        for s in seqs:
            self.waiting.put(s)
        while not self.waiting.empty() or self.deferred or self.active():
            self._admit()
            self._fill()
            self._first()
            if self.decoding():
                self._hand_out(self._run_chunk())

    def decoding(self) -> int:
        """Rows decoding (active, their prompts wholly in the cache)."""
        return sum(r is not None and i not in self.filling for i, r in enumerate(self.rows))

    def _next(self):
        """The next sequence waiting (one put back for want of pages first), or None."""
        if self.deferred:
            return self.deferred.popleft()
        try:
            return self.waiting.get_nowait()
        except queue.Empty:
            return None

    def _row_for(self) -> int | None:
        """The free row a new sequence goes into: the lowest (a decode runs the smallest row bucket holding every
        active row, so one client keeps to one row); None when every row runs."""
        return next((r for r in range(self.slots) if self.rows[r] is None), None)

    def _admit(self) -> None:
        new: list = []  # (row, prompt) of the prompts prefilled whole from position 0: together, at the end
        while any(r is None for r in self.rows):
            seq = self._next()
            if seq is None:
                break
            if seq.cancelled():
                continue
            busy = self.decoding() > 0  # before this row counts
            m, keep = self.shared(seq.prompt, seq.adapter)
            more = max(m + pages.PAGE, SHARED_MIN)  # pages it would share beyond the store's, once theirs are in
            if self.prefix_cache and any(self._common(p, seq.prompt[:-1]) >= more for _, p, _ in new):
                self._prefill_new(new)
                new = []
                m, keep = self.shared(seq.prompt, seq.adapter)
            row = self._row_for()
            tokens = min(len(seq.prompt) + seq.max_tokens, self.max_len)
            if not self.book.take(row, keep, tokens):
                self.deferred.appendleft(seq)  # no room for it until rows finish
                break
            self.reused += m
            self.held[row] = list(seq.prompt[:m])  # what its pages hold now (a piece at a time: until the next)
            self.rows[row], self.positions_B[row] = seq, -1  # -1: no decode step writes or reads it yet
            self.row_adapter[row] = seq.adapter
            self.admitted += 1
            if busy and len(seq.prompt) - m > self.prefill_chunk:  # rows decode: a piece between two chunks
                self.filling[row] = m
                continue
            if len(seq.prompt) - m <= self.prefill_chunk:  # one piece: with the others admitted now
                new.append((row, seq.prompt, m))
                continue
            while m < len(seq.prompt):  # nobody waits: every piece now
                end = min(m + self.prefill_chunk, len(seq.prompt))
                self._prefill_into(row, seq.prompt, m, end)
                m = end
            self.positions_B[row] = len(seq.prompt)
        self._prefill_new(new)

    def _first(self) -> None:
        """The first token of every row whose prompt is now in (and without a grammar), sampled from its prefill's
        logits and handed out at once: its client does not wait for the next decode call (which feeds it,
        `forced_B`). A one-token answer ends here, with no decode call; an end of text is left to that call, which
        ends the row as usual."""
        new = [i for i, r in enumerate(self.rows) if r is not None and i not in self.filling and r.generated == 0
               and not r.sent and self.forced_B[i] < 0 and r.grammar is None and self.positions_B[i] >= 0]
        if not new:
            return
        R = next(b for b in self.row_buckets() if b >= len(new))
        rows = np.asarray(new + [new[0]] * (R - len(new)), np.int32)
        seqs = [self.rows[i] for i in rows]
        toks = np.asarray(self._first_tokens(self.logits_BV, rows, np.stack([s.key for s in seqs]),
                                             np.asarray([s.temperature for s in seqs], np.float32),
                                             np.asarray([s.top_k for s in seqs], np.int32),
                                             np.asarray([s.top_p for s in seqs], np.float32)))
        for row, tok in zip(new, toks.tolist()):
            seq, self.forced_B[row] = self.rows[row], tok
            if tok in self.eos or seq.cancelled():
                continue
            seq.sent = 1
            if seq.max_tokens <= 1:
                seq.generated = 1
                seq.emit([tok], "length")
                self._free(row)
            elif seq.emit([tok], None):  # a stop string in the first token: the row ends without decoding
                self._free(row)

    def _length(self, n: int) -> int:
        return next(b for b in self.length_buckets() if b >= n)

    def _run_chunk(self, B: int | None = None, K: int | None = None, L: int | None = None) -> np.ndarray:
        """One decode call of K steps (the program of a whole chunk, told to stop after K: one program per rows and
        length, not per K). By default over the smallest row bucket holding every active row, one step when a row
        streams or has just been admitted without its first token sent (a grammar's row), else a chunk, over the
        smallest length bucket holding every position the steps write."""
        live = [i for i, r in enumerate(self.rows) if r is not None and i not in self.filling]
        B = B or next(b for b in self.row_buckets() if b > max(live, default=0))
        guided = [i for i in live if i < B and self.rows[i].grammar is not None]
        K = K or (1 if guided or any((self.rows[i].generated == 0 and not self.rows[i].sent) or self.rows[i].stream
                                     for i in live) else self.chunk)
        if L is None:
            reach = max((int(self.positions_B[i]) + K for i in live if i < B), default=1)
            L = next((b for b in self.length_buckets() if b >= reach), self.max_len)
            if (B, self.chunk, L) not in self._compiled:
                self.say(f"zoo-serve: compiling the {decode_name(B, self.chunk, L)} (first use)")
                self._compiled.add((B, self.chunk, L))
        for i in live:
            if i < B:
                self.book.grow(i, int(self.positions_B[i]) + K)
        rows = self.rows[:B]
        temp = np.asarray([r.temperature if r else 0.0 for r in rows], np.float32)
        topk = np.asarray([r.top_k if r else 0 for r in rows], np.int32)
        topp = np.asarray([r.top_p if r else 1.0 for r in rows], np.float32)
        keys = np.stack([r.key if r else np.zeros(2, np.uint32) for r in rows])
        steps = np.asarray([r.generated if r else 0 for r in rows], np.int32)
        mask = np.full((B, words(self.vocab)), -1, np.int32)  # every token allowed, but in a grammar's rows
        for i in guided:
            self.rows[i].grammar.fill(mask, i)
        self.cache, self.logits_BV, toks_BK = self._decode(self.params, self.cache,
                                                           self.book.rows_table(slice(0, B), pages.pages_for(L)),
                                                           self.logits_BV,
                                                           jnp.asarray(self.positions_B[:B]), temp, topk, topp,
                                                           jnp.asarray(keys), steps, mask, np.int32(K),
                                                           adapters=self._lora(self.row_adapter[:B]),
                                                           forced_B=self.forced_B[:B].copy(), B=B,
                                                           K=max(K, self.chunk), L=L)
        self.forced_B[:B] = -1  # fed at its first step
        self.batches += 1
        return np.asarray(toks_BK)[:, :K]

    def _hand_out(self, toks_BK: np.ndarray) -> None:
        for row, seq in enumerate(self.rows[:len(toks_BK)]):
            if seq is None or row in self.filling:
                continue
            if seq.cancelled():
                self._free(row)
                continue
            ids, finish = [], None
            for t in toks_BK[row].tolist():
                if t in self.eos:
                    finish = "stop"
                    break
                ids.append(t)
                seq.generated += 1
                if seq.grammar is not None and seq.grammar.advance(t):  # the schema's text is complete
                    finish = "stop"
                    break
                if seq.generated >= seq.max_tokens:
                    finish = "length"
                    break
                if self.positions_B[row] + len(ids) >= self.max_len:  # the cache is full: no room for another
                    finish = "length"
                    break
            self.positions_B[row] += len(ids)
            self.held[row] += ids  # fed back: their keys and values are in the row's slots
            skip, seq.sent = seq.sent, 0  # the first token went out already (`_first`)
            stop = seq.emit(ids[skip:], finish) if ids[skip:] or finish is not None else False
            if finish is not None or stop:
                self._free(row)

    def _free(self, row: int) -> None:
        self.forced_B[row] = -1
        self._store(row)  # the tokens it decoded too: a next turn's prompt starts with them
        self.rows[row], self.positions_B[row] = None, -1
        self.filling.pop(row, None)
        self.book.done(row)
        self.held[row] = []
