"""Retrieval evaluation of an embedding model on a BEIR-layout dataset, read locally (`zoo-eval MODEL --task
retrieval DIR`): the queries and the corpus embedded with `Pretrained.embed` (the queries with the checkpoint's
"query" prompt where it names one), an exact search on the device (cosine similarity: every query against every
document, the top MAX_K kept, queries in blocks), and the metrics BEIR reports (pytrec_eval's definitions):

- nDCG@10: sum over the top 10 of rel / log2(rank + 1), over the same sum of the ideal ranking of the query's
  judged documents (graded relevance as the qrels give it);
- MRR@10: 1 / the rank of the first relevant document (relevance > 0) in the top 10, 0 when none is;
- recall@k (k = 1, 10, 100): the relevant documents in the top k over all of the query's relevant documents.

Each is the mean over the queries that have a relevant document in the qrels of the split. `--index faiss` searches
with faiss-cpu's exact inner-product index (IndexFlatIP) on the host instead, for corpora larger than the device
holds; the model `bm25` is the lexical baseline (zoo.eval.bm25). `builtin` (not a folder) is the offline set built
from Python's documentation (zoo.data.pydoc_pairs): its test topics' paragraphs, each first sentence a query whose
one relevant document is the rest of its paragraph (split `train`: the topics task=embed's builtin trains on).
The layout:
DIR/corpus.jsonl ({"_id", "title", "text"} a line; a document is embedded as title + " " + text, as BEIR's
sentence-transformers model joins them), DIR/queries.jsonl ({"_id", "text"}), DIR/qrels/SPLIT.tsv (query-id,
corpus-id, score; a header line).
"""

from __future__ import annotations

import csv
import json
import math
import os

import numpy as np

from zoo.errors import ZooDataError
from zoo.eval import bm25

K_VALUES = (1, 10, 100)
MAX_K = 100
BLOCK = 256  # queries scored against the whole corpus at once
BUILTIN = "builtin"
INDEXES = ("exact", "faiss")  # exact on the device (search), or faiss-cpu's IndexFlatIP (search_faiss)


def _jsonl(path: str, fields: tuple) -> list[dict]:
    if not os.path.isfile(path):
        raise ZooDataError(f"{path!r}: no such file (a BEIR dataset folder holds corpus.jsonl, queries.jsonl and "
                           f"qrels/SPLIT.tsv)")
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ZooDataError(f"line {n} of {path} is not JSON ({e.msg})") from None
            missing = [k for k in fields if k not in row]
            if missing:
                raise ZooDataError(f"line {n} of {path} has no {', '.join(map(repr, missing))} field")
            rows.append(row)
    if not rows:
        raise ZooDataError(f"{path} holds no rows")
    return rows


def read_beir(path: str, split: str = "test") -> tuple[dict, dict, dict]:
    """(corpus {id: text}, queries {id: text}, qrels {query id: {doc id: relevance}}) of a BEIR folder; qrels of
    queries or documents the files do not hold are refused, naming the first."""
    corpus = {str(r["_id"]): (f"{r.get('title') or ''} {r['text']}".strip()) for r in
              _jsonl(os.path.join(path, "corpus.jsonl"), ("_id", "text"))}
    queries = {str(r["_id"]): r["text"] for r in _jsonl(os.path.join(path, "queries.jsonl"), ("_id", "text"))}
    qrels_path = os.path.join(path, "qrels", f"{split}.tsv")
    if not os.path.isfile(qrels_path):
        have = sorted(f[:-4] for f in os.listdir(os.path.join(path, "qrels")) if f.endswith(".tsv")) \
            if os.path.isdir(os.path.join(path, "qrels")) else []
        raise ZooDataError(f"{qrels_path!r}: no such file; splits here: {', '.join(have) or 'none'}")
    qrels: dict = {}
    with open(qrels_path, encoding="utf-8") as f:
        for n, row in enumerate(csv.reader(f, delimiter="\t"), 1):
            if n == 1 and not row[-1].lstrip("-").isdigit():
                continue  # the header
            if len(row) < 3:
                raise ZooDataError(f"line {n} of {qrels_path}: want query-id, corpus-id, score")
            q, d, rel = row[0], row[1], int(row[2])
            for what, key, held in (("query", q, queries), ("document", d, corpus)):
                if key not in held:
                    raise ZooDataError(f"line {n} of {qrels_path}: {what} {key!r} is not in the {what} file")
            qrels.setdefault(q, {})[d] = rel
    return corpus, queries, qrels


def read_builtin(split: str = "test") -> tuple[dict, dict, dict]:
    """The offline pydoc set as read_beir gives a folder: query i's one relevant document is passage i."""
    from zoo.data import pydoc_pairs
    if split not in pydoc_pairs.SPLITS:
        raise ZooDataError(f"--split {split!r}: the builtin retrieval set has splits {', '.join(pydoc_pairs.SPLITS)}")
    queries, passages = pydoc_pairs.pairs(split)
    return ({f"d{i}": p for i, p in enumerate(passages)}, {f"q{i}": q for i, q in enumerate(queries)},
            {f"q{i}": {f"d{i}": 1} for i in range(len(queries))})


def read_set(path: str, split: str = "test") -> tuple[dict, dict, dict]:
    """(corpus, queries, qrels) of a BEIR folder, or of `builtin` where no folder of that name exists."""
    return read_builtin(split) if path == BUILTIN and not os.path.isdir(path) else read_beir(path, split)


def search(q_QD: np.ndarray, c_ND: np.ndarray, k: int = MAX_K) -> tuple[np.ndarray, np.ndarray]:
    """Exact cosine search on the device: (scores [Q, k], document indices [Q, k]), best first."""
    import jax
    import jax.numpy as jnp
    k = min(k, c_ND.shape[0])
    unit = lambda x: x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)  # noqa: E731
    c_ND = unit(jnp.asarray(c_ND, jnp.float32))
    top = jax.jit(lambda q, c: jax.lax.top_k(jnp.einsum("QD,ND->QN", unit(q), c), k))
    scores, idx = [], []
    for i in range(0, q_QD.shape[0], BLOCK):
        s, j = top(jnp.asarray(q_QD[i:i + BLOCK], jnp.float32), c_ND)
        scores.append(np.asarray(s))
        idx.append(np.asarray(j))
    return np.concatenate(scores), np.concatenate(idx)


def search_faiss(q_QD: np.ndarray, c_ND: np.ndarray, k: int = MAX_K) -> tuple[np.ndarray, np.ndarray]:
    """search's results from faiss-cpu's exact inner-product index over the unit vectors, on the host."""
    try:
        import faiss
    except ImportError:
        raise ZooDataError("--index faiss needs faiss-cpu: pip install faiss-cpu (zoo's retrieval extra)") from None
    unit = lambda x: x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)  # noqa: E731
    index = faiss.IndexFlatIP(c_ND.shape[1])
    index.add(np.ascontiguousarray(unit(np.asarray(c_ND, np.float32))))
    return index.search(np.ascontiguousarray(unit(np.asarray(q_QD, np.float32))), min(k, c_ND.shape[0]))


def metrics(ranked: dict, qrels: dict, k_values=K_VALUES) -> dict:
    """nDCG@10, MRR@10 and recall@k of `ranked` ({query id: [doc id, ...] best first}) against `qrels`, the mean
    over the queries with a relevant document; "queries" counts them."""
    ndcg, mrr, recall = [], [], {k: [] for k in k_values}
    for q, judged in qrels.items():
        relevant = {d for d, r in judged.items() if r > 0}
        if not relevant:
            continue
        docs = ranked.get(q, [])
        dcg = sum(judged.get(d, 0) / math.log2(i + 2) for i, d in enumerate(docs[:10]))
        ideal = sorted((r for r in judged.values() if r > 0), reverse=True)[:10]
        ndcg.append(dcg / sum(r / math.log2(i + 2) for i, r in enumerate(ideal)))
        first = next((i for i, d in enumerate(docs[:10]) if d in relevant), None)
        mrr.append(0.0 if first is None else 1.0 / (first + 1))
        for k in k_values:
            recall[k].append(len(relevant & set(docs[:k])) / len(relevant))
    if not ndcg:
        raise ZooDataError("no query of the qrels has a relevant document (score > 0)")
    out = {"queries": len(ndcg), "ndcg@10": float(np.mean(ndcg)), "mrr@10": float(np.mean(mrr))}
    out.update({f"recall@{k}": float(np.mean(v)) for k, v in recall.items()})
    return out


def evaluate(lm, path: str, *, split: str = "test", batch_size: int = 32, max_docs: int | None = None,
             prompts=(), index: str = "exact") -> dict:
    """The metrics of `lm`'s embeddings (a Pretrained, or "bm25": zoo.eval.bm25) on the set `path` (a BEIR folder
    or `builtin`, see the module's docstring), searched by `index` (INDEXES); `max_docs` keeps the first documents
    of the corpus (and the judgements on them) for a quick look; `prompts` the names of the checkpoint's prompts
    (zoo.api.embed.pooling_of(lm).prompts): "query" and "document" are used where named."""
    if index not in INDEXES:
        raise ZooDataError(f"--index {index!r}: choose one of {', '.join(INDEXES)}")
    corpus, queries, qrels = read_set(path, split)
    if max_docs:
        corpus = dict(list(corpus.items())[:max_docs])
        qrels = {q: {d: r for d, r in j.items() if d in corpus} for q, j in qrels.items()}
    qids = [q for q in qrels if q in queries]
    dids = list(corpus)
    how = {"exact": "exact cosine search", "faiss": "faiss IndexFlatIP cosine search"}[index]
    if isinstance(lm, str) and lm == bm25.NAME:
        how = "BM25Okapi"
        idx = bm25.search([queries[q] for q in qids], [corpus[d] for d in dids], MAX_K)
    else:
        named = set(prompts)
        q_QD = lm.embed([queries[q] for q in qids], batch_size=batch_size,
                        prompt_name="query" if "query" in named else None)
        c_ND = lm.embed([corpus[d] for d in dids], batch_size=batch_size,
                        prompt_name="document" if "document" in named else None)
        _, idx = (search_faiss if index == "faiss" else search)(q_QD, c_ND)
    ranked = {q: [dids[j] for j in row] for q, row in zip(qids, idx)}
    return {"search": how, "documents": len(dids), **metrics(ranked, qrels)}
