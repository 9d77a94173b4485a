"""The offline retrieval set built from Python's docs (zoo.data.pydoc_pairs: `zoo-eval MODEL --task retrieval
builtin`), disjoint by topic from task=embed's builtin training pairs; the BM25 baseline (zoo.eval.bm25, as
rank-bm25's users rank with it); faiss-cpu's exact index giving the device search's results."""

import json

import numpy as np
import pytest

from zoo.cli import eval as eval_cli
from zoo.data import pydoc_pairs
from zoo.eval import bm25, retrieval
from zoo.tasks import embed as embed_task


def test_the_builtin_split_is_by_topic_and_task_embed_trains_on_its_train_part_only():
    rows = pydoc_pairs.all_pairs()
    test_topics = {t for t, _, _ in rows if pydoc_pairs.is_test_topic(t)}
    train_q, train_p = pydoc_pairs.pairs("train")
    test_q, test_p = pydoc_pairs.pairs("test")
    assert 100 < len(test_q) < len(train_q) and len(train_q) + len(test_q) == len(rows)
    assert 5 < len(test_topics) < len({t for t, _, _ in rows}) / 3
    assert {q for t, q, _ in rows if t in test_topics} == set(test_q)
    trained = embed_task.builtin_pairs()
    assert trained["anchor"] == train_q and trained["positive"] == train_p
    assert not set(trained["anchor"]) & set(test_q) and not set(trained["positive"]) & set(test_p)


def test_the_builtin_set_reads_as_a_beir_folder():
    corpus, queries, qrels = retrieval.read_set("builtin")
    test_q, test_p = pydoc_pairs.pairs("test")
    assert list(queries.values()) == test_q and list(corpus.values()) == test_p
    for q, judged in qrels.items():
        (d, rel), = judged.items()
        assert rel == 1 and test_q.index(queries[q]) == test_p.index(corpus[d])
    assert list(retrieval.read_set("builtin", "train")[1].values()) == pydoc_pairs.pairs("train")[0]


def _folder(path, docs: list[str], queries: list[str]) -> str:
    """A BEIR folder: query i relevant to document i."""
    (path / "qrels").mkdir()
    (path / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n"
                                               for i, t in enumerate(docs)))
    (path / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": t}) + "\n"
                                                for i, t in enumerate(queries)))
    (path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" +
                                             "".join(f"q{i}\td{i}\t1\n" for i in range(len(queries))))
    return str(path)


def test_bm25_ranks_the_document_sharing_the_rare_words_first(tmp_path, capsys):
    docs = ["The cat sat on the mat.", "A dog chased the ball in the park.", "Functions return values to callers.",
            "The mat was red, and the cat was black.", "Parks are green in the spring."]
    folder = _folder(tmp_path, docs, ["Which dog chased a BALL?", "what do FUNCTIONS return", "spring, parks"])
    # queries 0, 1, 2 name documents 1, 2, 4: the qrels say documents 0, 1, 2, so re-point them
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td1\t1\nq1\td2\t1\nq2\td4\t1\n")
    assert bm25.tokenize("Which dog, chased a BALL?") == ["which", "dog", "chased", "a", "ball"]
    assert eval_cli.main(["bm25", "--task", "retrieval", folder, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["search"] == "BM25Okapi" and out["queries"] == 3 and out["documents"] == 5
    assert out["ndcg@10"] == 1.0 and out["recall@1"] == 1.0


def test_bm25_on_the_builtin_set_equals_rank_bm25s_own_top_n(capsys):
    from rank_bm25 import BM25Okapi
    assert eval_cli.main(["bm25", "--task", "retrieval", "builtin", "--json"]) == 0
    ours = json.loads(capsys.readouterr().out)
    queries, passages = pydoc_pairs.pairs("test")
    index = BM25Okapi([p.lower().split() for p in passages])  # rank-bm25's README tokenizes by spaces
    words = BM25Okapi([bm25.tokenize(p) for p in passages])
    hits = [p in words.get_top_n(bm25.tokenize(q), passages, n=10) for q, p in zip(queries, passages)]
    assert ours["queries"] == len(queries) == 213 and ours["recall@10"] == pytest.approx(np.mean(hits), abs=1e-12)
    spaces = np.mean([p in index.get_top_n(q.lower().split(), passages, n=10) for q, p in zip(queries, passages)])
    assert ours["recall@10"] > spaces  # word tokens, punctuation off, find more than bare splitting on spaces
    assert ours["ndcg@10"] > 0.4


class _HashedLM:
    """An embedder whose vectors are seeded by each text: enough to compare two searches over the same vectors."""

    def embed(self, texts, batch_size=32, prompt_name=None):
        return np.stack([np.random.default_rng(abs(hash(t)) % 2**32).normal(size=48) for t in texts]).astype(np.float32)


def test_faiss_flat_index_gives_the_device_searchs_results():
    rng = np.random.default_rng(0)
    q, c = rng.normal(size=(40, 32)).astype(np.float32), rng.normal(size=(300, 32)).astype(np.float32) * 3
    s_exact, i_exact = retrieval.search(q, c)
    s_faiss, i_faiss = retrieval.search_faiss(q, c)
    assert i_faiss.shape == (40, 100) and (i_faiss == i_exact).all()
    np.testing.assert_allclose(s_faiss, s_exact, atol=1e-5)
    exact = retrieval.evaluate(_HashedLM(), "builtin")
    faiss = retrieval.evaluate(_HashedLM(), "builtin", index="faiss")
    assert exact.pop("search") == "exact cosine search" and faiss.pop("search") == "faiss IndexFlatIP cosine search"
    assert faiss == exact and exact["recall@100"] < 1.0  # random vectors: the search is not trivially complete


def test_bad_choices_are_one_line(capsys):
    assert eval_cli.main(["bm25", "builtin"]) == 2
    assert "bm25 is a retrieval baseline (--task retrieval); --task perplexity" in capsys.readouterr().err
    assert eval_cli.main(["bm25", "--task", "retrieval", "builtin", "--split", "dev"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--split 'dev'" in err[0] and "train, test" in err[0]
    with pytest.raises(ValueError, match="splits train, test"):
        pydoc_pairs.pairs("validation")
    with pytest.raises(SystemExit):
        eval_cli.main(["bm25", "--task", "retrieval", "builtin", "--index", "hnsw"])
