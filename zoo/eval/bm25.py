"""BM25, the lexical baseline users compare embeddings with (`zoo-eval bm25 --task retrieval DIR`): rank-bm25's
BM25Okapi (k1 1.5, b 0.75, its defaults) over lowercased word tokens (runs of letters, digits and underscores), the
documents of each query ranked by score, ties in corpus order. The same metrics as the embedding models'
(zoo.eval.retrieval)."""

from __future__ import annotations

import re

import numpy as np

from zoo.errors import ZooDataError

NAME = "bm25"  # the model name zoo-eval reads as this baseline
WORD = re.compile(r"\w+")


def tokenize(text: str) -> list[str]:
    return WORD.findall(text.lower())


def search(queries: list[str], docs: list[str], k: int) -> np.ndarray:
    """int[Q, k]: each query's top k document indices, best first."""
    try:
        from rank_bm25 import BM25Okapi
    except ImportError:
        raise ZooDataError("the bm25 baseline needs rank-bm25: pip install rank-bm25 (zoo's retrieval extra)") from None
    index = BM25Okapi([tokenize(d) for d in docs])
    k = min(k, len(docs))
    return np.stack([np.argsort(-index.get_scores(tokenize(q)), kind="stable")[:k] for q in queries])
