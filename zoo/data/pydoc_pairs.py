"""Offline (query, passage) pairs from Python's own documentation (`pydoc_data.topics`, shipped with CPython): each
topic paragraph's first sentence (the query) and the rest of the paragraph (its passage), split by topic into a
training part and a held-out test part.

The split is by topic, not by pair, so no held-out query shares a topic with a pair trained on:
a topic is held out iff doc_hash(name) < TEST_FRACTION (13 of the 65 topics with pairs in CPython 3.11, 215 of its
641 pairs). task=embed's `data.source=builtin` trains on the "train" part; `zoo-eval MODEL --task retrieval
builtin` searches the "test" part (zoo.eval.retrieval). The text is the running Python's, so the pairs are the
same on every machine with the same Python minor version.
"""

from __future__ import annotations

import re

from zoo.data.store import doc_hash

TEST_FRACTION = 0.15  # of the topics, by the hash of their names
MIN_QUERY = 20  # characters; shorter first sentences are mostly headings
MIN_PASSAGE = 40  # characters; shorter rests are one-line grammar rules
SPLITS = ("train", "test")


def is_test_topic(name: str) -> bool:
    return doc_hash(name) < TEST_FRACTION


def all_pairs() -> list[tuple[str, str, str]]:
    """(topic, query, passage) of every topic, in topic order; a pair whose query or passage was seen before (in
    any topic) is skipped, so no text is in both splits."""
    from pydoc_data.topics import topics
    out, seen = [], set()
    for name in sorted(topics):
        for para in re.split(r"\n\s*\n", topics[name]):
            head, _, rest = " ".join(para.split()).partition(". ")
            if len(head) >= MIN_QUERY and len(rest) >= MIN_PASSAGE and not {head, rest} & seen:
                seen.update((head, rest))
                out.append((name, head + ".", rest))
    return out


def pairs(split: str) -> tuple[list[str], list[str]]:
    """(queries, passages) of the split's topics ("train" or "test")."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r}: the built-in pydoc pairs have splits {', '.join(SPLITS)}")
    rows = [(q, p) for topic, q, p in all_pairs() if is_test_topic(topic) == (split == "test")]
    return [q for q, _ in rows], [p for _, p in rows]
