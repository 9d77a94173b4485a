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
