"""zoo-serve's engine without a server: a row's greedy tokens are zoo.infer.sample's, as its decode reads the rows'
first L slots of the cache (a length bucket), grows L as the row grows, and hands a streaming row's tokens out one
by one."""

import threading

import numpy as np
import pytest

import zoo
from zoo.infer import sample
from zoo.serve.engine import Engine, Sequence


@pytest.fixture(scope="module")
def lm():
    return zoo.load("llama_tiny")  # 4 query heads on 2 key/value heads, a 256-token window


def _run(engine, seqs):
    """Decode `seqs` to the end on the engine's loop; their tokens."""
    got, done = [[] for _ in seqs], threading.Event()
    left = [len(seqs)]

    def emitter(i):
        def emit(ids, finish):
            got[i].append(list(ids))
            if finish is not None:
                left[0] -= 1
                if not left[0]:
                    done.set()
        return emit
    for i, s in enumerate(seqs):
        s.emit = emitter(i)
    engine.submit(seqs)
    engine.start()
    try:
        assert done.wait(120), "the engine did not finish"
    finally:
        engine.stop()
    return got


def test_decoding_reads_a_length_bucket_that_grows_with_the_row_and_answers_as_sample_does(lm):
    engine = Engine(lm, slots=2, max_len=256, chunk=8)
    lengths = []
    decode = engine._decode

    def spy(*a, **kw):
        lengths.append(kw["L"])
        return decode(*a, **kw)
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


def test_a_streaming_row_gets_its_tokens_one_at_a_time(lm):
    engine = Engine(lm, slots=2, max_len=128, chunk=8)
    rng = np.random.default_rng(1)
    seqs = [Sequence(prompt=rng.integers(1, 256, 20).tolist(), max_tokens=12, temperature=0.0, stream=s)
            for s in (True, False)]
    streamed, gathered = _run(engine, seqs)
    assert [len(c) for c in streamed[:-1]] == [1] * (len(streamed) - 1)  # each token as it is sampled
    assert sum(map(len, streamed), 0) == sum(map(len, gathered), 0)
