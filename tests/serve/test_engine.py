"""zoo-serve's engine without a server: a row's greedy tokens are zoo.infer.sample's, as its decode reads the rows'
first L slots of the cache (a length bucket), grows L as the row grows, and hands a streaming row's tokens out one
by one."""

import threading

import jax
import numpy as np
import pytest

import zoo
from zoo.errors import ArgumentError
from tests.helpers.engine_runs import decode_all, on_prefill
from zoo.infer import sample
from zoo.engine.batching import Engine, Sequence


@pytest.fixture(scope="module")
def lm():
    return zoo.load("llama_tiny")  # 4 query heads on 2 key/value heads, a 256-token window


def _run(engine, seqs):
    """Decode `seqs` to the end on the engine's loop; their tokens, as the chunks handed out."""
    return decode_all(engine, seqs, timeout=120)[0]


def test_decoding_reads_a_length_bucket_that_grows_with_the_row_and_answers_as_sample_does(lm):
    engine = Engine(lm, slots=2, max_len=256, chunk=8)
    lengths = []
    decode = engine._decode

    def spy(*a, **kw):
        lengths.append(kw["L"])
        steps.append((int(a[-1]), kw["K"]))  # (steps run, the program's chunk)
        return decode(*a, **kw)
    steps = []
    engine._decode = spy
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 256, 100).tolist(), rng.integers(1, 256, 30).tolist()]
    seqs = [Sequence(prompt=p, max_tokens=60, temperature=0.0) for p in prompts]
    got = _run(engine, seqs)
    model, params = lm.decoding()
    for p, chunks in zip(prompts, got):
        want = sample.generate(model, params, p, 60, temperature=0.0, eos_id=sample.stop_ids(lm.tokenizer),
                               vocab_limit=lm.tokenizer.n_vocab)[0]
        assert sum(chunks, []) == want
    assert lengths[0] == 128 and lengths[-1] == 256 and sorted(lengths) == lengths  # 100 + 60 tokens pass 128
    # a new row's first token goes out as its prompt is in (Engine._first), alone, so its first decode call is a
    # whole chunk: one program per rows and length (a streamed step runs it too, stopped after one)
    assert [len(chunks[0]) for chunks in got] == [1, 1] and all(len(c) > 1 for c in got[0][1:-1])
    assert steps[0] == (8, 8) and {k for _, k in steps} == {8} and {n for n, _ in steps} == {8}
    assert engine.programs() == len(engine.warm_plan()) and sum(p[0] == "decode" for p in engine.warm_plan()) == 4


def test_the_layers_looped_or_scanned_decode_the_same_tokens(lm):
    """The engine decodes with the layers one after another (zoo.infer.sample.unscanned) unless asked to scan them:
    the same greedy tokens either way (tests/infer/test_scanned.py: unscanned undoes scanned)."""
    rng = np.random.default_rng(4)
    prompts = [rng.integers(1, 256, n).tolist() for n in (40, 70)]
    got = []
    for scan in (False, True):
        engine = Engine(lm, slots=2, max_len=128, chunk=4, scan_layers=scan)
        assert engine.model.cfg.scan_layers == scan
        got.append(_run(engine, [Sequence(prompt=p, max_tokens=20, temperature=0.0) for p in prompts]))
    assert [sum(c, []) for c in got[0]] == [sum(c, []) for c in got[1]] and len(sum(got[0][0], [])) == 20


def test_a_streaming_row_gets_its_tokens_one_at_a_time(lm):
    engine = Engine(lm, slots=2, max_len=128, chunk=8)
    rng = np.random.default_rng(1)
    seqs = [Sequence(prompt=rng.integers(1, 256, 20).tolist(), max_tokens=12, temperature=0.0, stream=s)
            for s in (True, False)]
    streamed, gathered = _run(engine, seqs)
    assert [len(c) for c in streamed[:-1]] == [1] * (len(streamed) - 1)  # each token as it is sampled
    assert sum(map(len, streamed), 0) == sum(map(len, gathered), 0)


def test_a_prompt_sharing_a_stored_prefix_takes_its_pages_and_answers_the_same(lm):
    """A second prompt with the first's 150-token system prefix holds the first's 9 whole pages of it (144 tokens,
    PAGE 16) by reference, nothing copied, and prefills only the rest; a third, admitted once both have ended,
    finds them in the prefix store, and a next turn finds the tokens its row decoded. Every answer is
    zoo.infer.sample's greedy one, as without the cache."""
    rng = np.random.default_rng(2)
    system = rng.integers(1, 256, 150).tolist()
    prompts = [system + rng.integers(1, 256, n).tolist() for n in (20, 35, 9)]
    engine = Engine(lm, slots=2, max_len=256, chunk=4)
    prefills = []
    on_prefill(engine, lambda *call: prefills.append(call))
    got = [[] for _ in prompts]

    def seq(i):
        return Sequence(prompt=prompts[i], max_tokens=10, temperature=0.0, emit=lambda ids, f: got[i].extend(ids))

    def drain():
        while engine.active():
            engine._hand_out(engine._run_chunk())
    engine.submit([seq(0), seq(1)])
    engine._admit()
    assert prefills == [(0, 256, 256), (144, 64, 256)] and engine.reused == 144  # 9 pages shared: 41 prefilled
    book = engine.book
    shared = book.owned[0][:9]
    assert book.owned[1][:9] == shared and all(book.refs[p] == 2 for p in shared)
    assert not set(book.owned[1][9:]) & set(book.owned[0])  # its own pages past the prefix
    drain()
    engine.submit([seq(2)])
    assert not any(book.owned) and all(p in book.idle for p in shared)  # ended: the pages stay in the store
    engine._admit()
    assert engine.rows[0] is not None and prefills[-1] == (144, 16, 256) and engine.reused == 288
    assert book.owned[0][:9] == shared and all(book.refs[p] == 1 for p in shared)
    drain()
    # A next turn: the store holds the second prompt and the tokens its row decoded (fed back), all shared.
    engine.submit([Sequence(prompt=prompts[1] + got[1] + [7, 8], max_tokens=1, temperature=0.0)])
    engine._admit()
    assert engine.reused == 288 + (len(prompts[1]) + len(got[1])) // 16 * 16 and len(got[1]) == 10
    drain()
    model, params = lm.decoding()
    for p, tokens in zip(prompts, got):
        want = sample.generate(model, params, p, 10, temperature=0.0, eos_id=sample.stop_ids(lm.tokenizer),
                               vocab_limit=lm.tokenizer.n_vocab)[0]
        assert tokens == want
    off = Engine(lm, slots=2, max_len=256, chunk=4, prefix_cache=False)
    off.submit([Sequence(prompt=p, max_tokens=1) for p in prompts[:2]])
    off._admit()
    assert off.reused == 0 and not set(off.book.owned[0]) & set(off.book.owned[1])


def test_a_piece_moved_back_to_fit_the_window_reads_the_shared_page_it_computes_again_and_never_writes_it(lm):
    """A prompt of 120 tokens whose first 80 (5 pages) are stored, in a 128-token window: its 40 new tokens take a
    64-token piece, which ends past the window from position 80, so it starts at 64 and computes page 4 (a shared
    page) again; the prefill reads that page and writes only from position 80 on (programs.prefill's own_from).
    Checked on the program itself (a page before own_from keeps what it held, bit for bit, in every layer) and end
    to end (the answer is zoo.infer.sample's, the shared pages unchanged)."""
    rng = np.random.default_rng(9)
    first = rng.integers(1, 256, 80).tolist()
    second = first + rng.integers(1, 256, 40).tolist()
    engine = Engine(lm, slots=2, max_len=128, chunk=4)
    # the program: 32 tokens from position 0 into pages 1 and 2, writing from position 16 on
    engine.cache = jax.tree.map(lambda c: c + 7.0, engine.cache)
    one = np.zeros(1, np.int32)
    engine.cache, engine.logits_BV = engine._prefill(engine.params, engine.cache, np.asarray([[1, 2]], np.int32),
                                                     engine.logits_BV, one, np.asarray([second[:32]], np.int32),
                                                     one + 32, one, one + 16, None)
    # [pages, PAGE, K, H] per layer for keys and for values, or one [pages, PAGE, 2K, H] with the CPU kernel's pool
    pools = lambda: [c for c in jax.tree.leaves(engine.cache) if c.ndim == 4]  # noqa: E731
    assert len(pools()) == (1 if engine.kernel else 2) * engine.model.cfg.num_layers
    for c in pools():
        assert np.all(np.asarray(c[1]) == 7.0) and not np.any(np.asarray(c[2]) == 7.0)
    engine = Engine(lm, slots=2, max_len=128, chunk=4)
    prefills, got = [], []
    on_prefill(engine, lambda *call: prefills.append(call))
    _run(engine, [Sequence(prompt=first, max_tokens=4, temperature=0.0)])
    shared = engine.book.lookup(second[:-1])
    assert len(shared) == 5
    before = [np.asarray(c[np.asarray(shared)]) for c in pools()]
    engine.stopping.clear()  # the loop again, on the same cache and store
    got = _run(engine, [Sequence(prompt=second, max_tokens=6, temperature=0.0)])[0]
    assert prefills[-1] == (64, 64, 128) and engine.reused == 80
    after = [np.asarray(c[np.asarray(shared)]) for c in pools()]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    model, params = lm.decoding()
    want = sample.generate(model, params, second, 6, temperature=0.0, eos_id=sample.stop_ids(lm.tokenizer),
                           vocab_limit=lm.tokenizer.n_vocab)[0]
    assert sum(got, []) == want


def test_a_cache_smaller_than_its_rows_makes_a_prompt_wait_for_pages_and_takes_back_idle_stored_ones(lm):
    """The pool is pages, not rows x window: with 8 pages (128 tokens) for 2 rows of 128, a second sequence whose
    prompt and answer need 5 pages waits while the first holds 5. Once the first ends its 5 pages stay in the
    prefix store, idle, and the second takes the 3 free pages and 2 idle ones, the last two of the first's (a
    sequence's pages go idle last to first, so what is taken back leaves its prefix reachable): the first prompt
    asked again takes its 3 remaining pages and prefills only its last 12 tokens. Every answer is sample's; a pool
    smaller than one window is one clear error."""
    from zoo.engine import pages
    rng = np.random.default_rng(6)
    engine = Engine(lm, slots=2, max_len=128, chunk=4, kv_pages=pages.pages_of_tokens(128))
    # scratch + 8 (the values' pool empty where the CPU kernel's holds keys and values in one)
    assert {a.shape[:2] for a in jax.tree.leaves(engine.cache) if a.ndim and a.size} == {(9, pages.PAGE)}
    model, params = lm.decoding()

    def run(jobs, check=None):  # (prompt, max_tokens) each, decoded to their ends; each answer against sample's
        got = [[] for _ in jobs]
        engine.submit([Sequence(prompt=p, max_tokens=n, temperature=0.0, emit=lambda ids, f, i=i: got[i].extend(ids))
                       for i, (p, n) in enumerate(jobs)])
        engine._admit()
        if check:
            check()
        for _ in range(100):  # a bound: a sequence never admitted fails here, not by hanging
            if not (engine.active() or engine.deferred):
                break
            engine._admit()
            if engine.decoding():
                engine._hand_out(engine._run_chunk())
        assert not engine.active() and not engine.deferred
        for (p, n), tokens in zip(jobs, got):
            assert tokens == sample.generate(model, params, p, n, temperature=0.0, eos_id=sample.stop_ids(lm.tokenizer),
                                             vocab_limit=lm.tokenizer.n_vocab)[0]

    def waits():
        assert engine.active() == 1 and len(engine.deferred) == 1 and engine.book.room() == 3
    first = rng.integers(1, 256, 60).tolist()
    run([(first, 20), (rng.integers(1, 256, 60).tolist(), 20)], waits)
    book = engine.book
    assert engine.admitted == 2 and book.evicted == 2 and len(book.idle) == 8 and not book.free
    kept = book.lookup(first)
    assert len(kept) == 3 and engine.reused == 0
    prefills = []
    on_prefill(engine, lambda start, P, S: prefills.append((start, P)))
    run([(first, 4)])  # 64 tokens: 4 pages, 3 of them stored, 1 taken back from the second's
    assert engine.reused == 48 and prefills == [(48, 16)] and book.evicted == 3 and book.owned == [[], []]
    with pytest.raises(ArgumentError, match="holds 112 tokens, fewer than one sequence of the context's 128"):
        Engine(lm, slots=2, max_len=128, kv_pages=8)


def test_a_long_prompt_admitted_while_rows_decode_is_prefilled_a_piece_between_their_chunks(lm):
    """A 100-token prompt arriving while a row decodes goes in 32-token pieces (prefill_chunk), each from its
    position on over the pieces before it, one piece between two of the other row's decode chunks; both answers
    are zoo.infer.sample's greedy ones."""
    rng = np.random.default_rng(3)
    prompts = [rng.integers(1, 256, 20).tolist(), rng.integers(1, 256, 100).tolist()]
    engine = Engine(lm, slots=2, max_len=256, chunk=2, prefill_chunk=32)
    got, events = [[], []], []
    decode = engine._decode
    on_prefill(engine, lambda *call: events.append(("prefill", *call)))
    engine._decode = lambda *a, **kw: events.append(("decode",)) or decode(*a, **kw)

    def seq(i):
        return Sequence(prompt=prompts[i], max_tokens=12, temperature=0.0, emit=lambda ids, f: got[i].extend(ids))

    def step():  # the engine's loop, one turn
        engine._admit()
        engine._fill()
        if engine.decoding():
            engine._hand_out(engine._run_chunk())
    engine.submit([seq(0)])
    step()
    engine.submit([seq(1)])
    while engine.active():
        step()
    at = [i for i, e in enumerate(events) if e[0] == "prefill"][1:]  # the first: the first row's whole prompt
    assert [events[i][1:] for i in at] == [(0, 32, 32), (32, 32, 128), (64, 32, 128), (96, 16, 128)]
    assert [b - a for a, b in zip(at, at[1:])] == [2, 2, 2]  # one decode chunk of the first row between two pieces
    model, params = lm.decoding()
    for p, tokens in zip(prompts, got):
        want = sample.generate(model, params, p, 12, temperature=0.0, eos_id=sample.stop_ids(lm.tokenizer),
                               vocab_limit=lm.tokenizer.n_vocab)[0]
        assert tokens == want
    # Admitted with nobody decoding: the same pieces, all at once, and the row decodes at the next chunk.
    alone = Engine(lm, slots=2, max_len=256, chunk=2, prefill_chunk=32)
    pieces = []
    on_prefill(alone, lambda *call: pieces.append(call))
    alone.submit([Sequence(prompt=prompts[1], max_tokens=12, temperature=0.0)])
    alone._admit()
    assert pieces == [(0, 32, 32), (32, 32, 128), (64, 32, 128), (96, 16, 128)] and alone.positions_B[0] == 100


@pytest.mark.parametrize("scan", [False, True], ids=["looped", "scanned"])
def test_new_prompts_admitted_together_are_prefilled_in_one_program_and_answer_as_sample_does(lm, scan):
    """Four prompts of one bucket (20-31 tokens: 32) arriving together go into one prefill of 4 rows once its
    program is compiled; until then they go one by one while it compiles in a thread, and the next burst takes
    it. Every greedy answer is zoo.infer.sample's."""
    rng = np.random.default_rng(5)
    prompts = [rng.integers(1, 256, n).tolist() for n in (20, 31, 25, 28)]
    engine = Engine(lm, slots=4, max_len=128, chunk=4, scan_layers=scan)
    singles = []
    on_prefill(engine, lambda start, P, S: singles.append(P))
    got = [[] for _ in prompts]

    def burst():
        for i in range(len(prompts)):
            got[i] = []
        engine.submit([Sequence(prompt=p, max_tokens=8, temperature=0.0, emit=lambda ids, f, i=i: got[i].extend(ids))
                       for i, p in enumerate(prompts)])
        engine._admit()
        while engine.active():
            engine._hand_out(engine._run_chunk())
        return [list(g) for g in got]
    first = burst()  # the 4-row program not compiled yet: one by one, its compile begun
    assert singles == [32] * 4 and engine.batched == 0 and (4, 32, 32) in engine._batched_started
    for _ in range(600):
        if (4, 32, 32) in engine._batched:
            break
        threading.Event().wait(0.1)
    second = burst()
    assert singles == [32] * 4 and engine.batched == 4  # no single prefill this time: one program of 4 rows
    model, params = lm.decoding()
    for p, a, b in zip(prompts, first, second):
        want = sample.generate(model, params, p, 8, temperature=0.0, eos_id=sample.stop_ids(lm.tokenizer),
                               vocab_limit=lm.tokenizer.n_vocab)[0]
        assert a == want and b == want


def test_eight_rows_decoding_together_answer_as_sample_does(lm):
    """8 rows: the decoding step's attention reads the grouped cache by products and sums
    (zoo.nn.attention.DECODE_REDUCE_ROWS); each row's greedy tokens are still zoo.infer.sample's."""
    from zoo.nn import attention
    assert attention.DECODE_REDUCE_ROWS <= 8
    rng = np.random.default_rng(8)
    prompts = [rng.integers(1, 256, 24).tolist() for _ in range(8)]
    engine = Engine(lm, slots=8, max_len=128, chunk=8)
    got = _run(engine, [Sequence(prompt=p, max_tokens=16, temperature=0.0) for p in prompts])
    model, params = lm.decoding()
    for p, chunks in zip(prompts, got):
        want = sample.generate(model, params, p, 16, temperature=0.0, eos_id=sample.stop_ids(lm.tokenizer),
                               vocab_limit=lm.tokenizer.n_vocab)[0]
        assert sum(chunks, []) == want


def test_long_rows_read_length_buckets_halfway_between_powers_of_two():
    """From 1,024 slots on, a decode's length bucket may be halfway between two powers of two: a row at 1,050 tokens
    reads 1,536 slots' keys and values, not 2,048."""
    import types
    from zoo.engine.warming import Warming
    buckets = Warming.length_buckets(types.SimpleNamespace(max_len=4000))
    assert buckets == [128, 256, 512, 1024, 1536, 2048, 3072, 4000]
    assert Warming.length_buckets(types.SimpleNamespace(max_len=256)) == [128, 256]


def test_prompts_taking_a_stored_prefix_together_are_prefilled_in_one_program_from_their_positions(lm):
    """Four prompts after a 40-token system prefix that the store holds (2 pages of 16) arriving together go into
    one prefill of 4 rows, each from position 32 over the first 128 slots of its pages (the stored prefix read,
    its own 18 tokens computed), not four prefills one by one; every greedy answer is zoo.infer.sample's."""
    rng = np.random.default_rng(9)
    system = rng.integers(1, 256, 40).tolist()
    prompts = [system + rng.integers(1, 256, 10).tolist() for _ in range(5)]
    engine = Engine(lm, slots=4, max_len=128, chunk=4)
    engine.compile_batched(4, 32, 128)
    singles = []
    on_prefill(engine, lambda start, P, S: singles.append((start, P)))
    got = [[] for _ in prompts]

    def run(idx):
        engine.submit([Sequence(prompt=prompts[i], max_tokens=6, temperature=0.0,
                                emit=lambda ids, f, i=i: got[i].extend(ids)) for i in idx])
        engine._admit()
        while engine.active():
            engine._hand_out(engine._run_chunk())
    run([0])  # alone: prefilled whole, its 3 whole pages stored (the first 2 the system prefix's)
    assert singles == [(0, 64)] and engine.reused == 0 and len(engine.book.lookup(system)) == 2
    run([1, 2, 3, 4])
    assert singles == [(0, 64)] and engine.batched == 4 and engine.reused == 4 * 32
    model, params = lm.decoding()
    for p, tokens in zip(prompts, got):
        assert tokens == sample.generate(model, params, p, 6, temperature=0.0, eos_id=sample.stop_ids(lm.tokenizer),
                                         vocab_limit=lm.tokenizer.n_vocab)[0]


def test_a_rows_first_token_goes_out_at_its_prefill_and_the_answer_is_the_one_decoded_without_it(lm):
    """The first token is sampled from the prefill's logits (Engine._first) and handed out before any decode call;
    the decode feeds it. Greedy, the answer is zoo.infer.sample's; sampled with a seed, the tokens are those the
    engine gives when its first decode step samples the first token itself."""
    from zoo.engine.programs import key_data
    rng = np.random.default_rng(10)
    prompt = rng.integers(1, 256, 30).tolist()
    ends = []

    def answer(temperature, early=True, max_tokens=9):
        engine = Engine(lm, slots=2, max_len=128, chunk=4)
        if not early:
            engine._first = lambda: None
        got = []
        engine.submit([Sequence(prompt=prompt, max_tokens=max_tokens, temperature=temperature, key=key_data(7, 0),
                                emit=lambda ids, f: got.append(list(ids)) or ends.append(f))])
        engine._admit()
        engine._first()
        first = list(got)
        while engine.active():
            engine._hand_out(engine._run_chunk())
        return first, sum(got, []), engine.batches
    first, greedy, batches = answer(0.0)
    model, params = lm.decoding()
    want = sample.generate(model, params, prompt, 9, temperature=0.0, eos_id=sample.stop_ids(lm.tokenizer),
                           vocab_limit=lm.tokenizer.n_vocab)[0]
    assert first == [want[:1]] and greedy == want and batches == 3  # 9 steps (the first feeds the token sent)
    early, late = answer(0.8), answer(0.8, early=False)
    assert len(early[0]) == 1 and late[0] == [] and early[1] == late[1] and len(late[1]) == 9
    # a one-token answer ends at its prefill: no decode call, its finish "length"
    ends.clear()
    assert answer(0.0, max_tokens=1) == ([want[:1]], want[:1], 0) and ends == ["length"]


def test_a_burst_prefilled_in_groups_sends_each_groups_first_tokens_before_the_next_group_is_prefilled(lm):
    """Eight prompts arriving together go in two prefills of four; the first four's first tokens go out as soon as
    theirs is done, not after the second (a burst's first tokens no longer wait for the whole burst)."""
    rng = np.random.default_rng(12)
    engine = Engine(lm, slots=8, max_len=128, chunk=4)
    engine.compile_batched(4, 32)
    events = []
    run = engine._run_prefill
    engine._run_prefill = lambda program, take, P, S: events.append(("prefill", [t[0] for t in take])) or \
        run(program, take, P, S)
    engine.submit([Sequence(prompt=rng.integers(1, 256, 20 + i).tolist(), max_tokens=4, temperature=0.0,
                            emit=lambda ids, f, i=i: events.append(("token", i))) for i in range(8)])
    engine._admit()
    assert events == [("prefill", [0, 1, 2, 3])] + [("token", i) for i in range(4)] + \
        [("prefill", [4, 5, 6, 7])] + [("token", i) for i in range(4, 8)]


def test_the_batched_prefills_after_a_stored_prefix_compile_in_threads_and_are_listed_meanwhile(lm):
    """compile_stored_later (zoo-serve, once it serves): the batched prefills of 16- and 32-token pieces after a
    stored prefix, 4 and 8 rows over the first length bucket, compile in threads; `compiling` (zoo-serve's
    /health) names them until each is in, then is empty. With the prefix cache off there is nothing to compile."""
    engine = Engine(lm, slots=8, max_len=256, chunk=4)
    engine.compile_stored_later()
    assert engine.compiling == {f"prefill of {R} prompts of up to {P} tokens over 128 slots" for R in (4, 8)
                                for P in (16, 32)}
    for _ in range(1200):
        if not engine.compiling:
            break
        threading.Event().wait(0.1)
    assert not engine.compiling and {(R, P, 128) for R in (4, 8) for P in (16, 32)} <= set(engine._batched)
    off = Engine(lm, slots=8, max_len=256, prefix_cache=False)
    off.compile_stored_later()
    assert not off.compiling and not off._batched_started
