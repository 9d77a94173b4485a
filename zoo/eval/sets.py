"""Evaluation sets zoo builds from text it has offline, so a score can be compared anywhere, with no download.

`builtin` (zoo-eval RUN --task choice builtin): continuation choice on Python's own documentation (the
`builtin` corpus). Only documents that the token store holds out for validation at the default
data.val_fraction (0.05, by document hash: zoo.data.store.doc_hash) are used, so a run trained on `builtin`
with that fraction has never seen them. Each question is a passage of about 100 characters cut at a word
boundary; the choices are the true next 30-odd characters and the continuations of three other questions, in a
fixed order per question. A model that knows English and Python's documentation picks the true one. The text is
the running Python's own pydoc_data, so the set is the same on every machine with the same Python minor version.
"""

from __future__ import annotations

import hashlib

from zoo.data.store import doc_hash

VAL_FRACTION = 0.05  # DataConfig's default: the documents every default-split run on builtin held out
CONTEXT, CONTINUATION, PER_DOC = 100, 30, 100
NAMED = ("builtin",)


def _cut(text: str, start: int, n: int) -> tuple[str, int]:
    """text[start:] up to the first space at or after n characters (the space left out), and where it ended."""
    end = text.find(" ", start + n)
    end = len(text) if end < 0 else end
    return text[start:end], end


def builtin_choice() -> list[dict]:
    from zoo.data.corpus import NAMED as CORPORA
    docs = [t for t in CORPORA["builtin"][0]() if doc_hash(t) < VAL_FRACTION]
    pairs = []
    for text in docs:
        text = " ".join(text.split())  # one line: reST layout is not what is asked
        start = 0
        for _ in range(PER_DOC):
            context, end = _cut(text, start, CONTEXT)
            continuation, nxt = _cut(text, end + 1, CONTINUATION)
            if len(continuation) < CONTINUATION // 2:
                break
            pairs.append((context, continuation))
            start = nxt + 1
    questions = []
    for i, (context, true) in enumerate(pairs):
        others = [pairs[(i + k * max(1, len(pairs) // 4)) % len(pairs)][1] for k in (1, 2, 3)]  # other documents'
        answer = int.from_bytes(hashlib.blake2b(context.encode(), digest_size=2).digest(), "big") % 4
        choices = others[:answer] + [true] + others[answer:]
        questions.append({"context": context, "choices": choices, "answer": answer})
    return questions


def named(name: str) -> list[dict]:
    return {"builtin": builtin_choice}[name]()
