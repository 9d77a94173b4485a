"""Running zoo-serve's engine in a test: its loop on its own thread until every sequence has ended."""

import threading


def decode_all(engine, seqs, timeout: float = 300):
    """Decode `seqs` to their ends on the engine's loop; (each one's tokens as the chunks it was handed, each one's
    finish reason)."""
    got, finish, done = [[] for _ in seqs], [None] * len(seqs), threading.Event()
    left = [len(seqs)]

    def emitter(i):
        def emit(ids, end):
            got[i].append(list(ids))
            if end is not None:
                finish[i] = end
                left[0] -= 1
                if not left[0]:
                    done.set()
        return emit
    for i, s in enumerate(seqs):
        s.emit = emitter(i)
    engine.submit(seqs)
    engine.start()
    try:
        assert done.wait(timeout), "the engine did not finish"
    finally:
        engine.stop()
    return got, finish


def on_prefill(engine, record) -> None:
    """Call record(start, P, S) at each call of the engine's jitted prefill (its first prompt's start position,
    the bucket P, the slots S it reads); the programs compiled apart (a batched prefill's) are not seen."""
    from zoo.engine.pages import PAGE
    prefill = engine._prefill

    def spy(params, cache, table, logits, rows, ids, lengths, starts, *rest):
        record(int(starts[0]), ids.shape[1], table.shape[1] * PAGE)
        return prefill(params, cache, table, logits, rows, ids, lengths, starts, *rest)
    spy.lower = prefill.lower  # the batched prefills compile from it
    engine._prefill = spy


def shared_prompts(seed: int = 0) -> list[list[int]]:
    """Prompts of 40, 70 and 5 tokens, and a fourth taking the second's first 48 (three of its pages) then its own."""
    import numpy as np
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(1, 256, n).tolist() for n in (40, 70, 5)]
    return prompts + [prompts[1][:48] + [7, 8, 9]]


def greedy_tokens(engine, prompts, max_tokens: int = 20) -> list[list[int]]:
    """Each prompt's greedy tokens, decoded to its end on the engine's loop."""
    from zoo.engine.sequence import Sequence
    chunks = decode_all(engine, [Sequence(prompt=p, max_tokens=max_tokens, temperature=0.0) for p in prompts],
                        timeout=300)[0]
    return [sum(c, []) for c in chunks]
