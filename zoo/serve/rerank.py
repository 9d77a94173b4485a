"""zoo-serve's `/v1/rerank`, in the shape vLLM and Cohere use, for a cross-encoder (a bert_cls checkpoint with one
output, e.g. a converted ms-marco-MiniLM): `{"model", "query", "documents": [a string or {"text": ...}, ...], "top_n",
"return_documents"}` -> `{"id", "model", "results": [{"index", "relevance_score", "document": {"text"}}, ...],
"usage": {"prompt_tokens", "total_tokens"}}`, best first. The scores are Pretrained.rerank's (the sigmoid of the
logit of [CLS] query [SEP] document [SEP], as sentence-transformers' CrossEncoder and vLLM's score them); `top_n` 0
or absent keeps every document; `return_documents` (default true, as vLLM always returns them) false leaves the
documents out. A cross-encoder's server answers this route (and /v1/models) alone, a request at a time; an
embedding model or a chat model asked to rerank gets a 400 saying what it serves instead."""

from __future__ import annotations

import asyncio
import uuid

from fastapi import Request

from zoo.serve.request_checks import ApiError, _field

FIELDS = ("model", "query", "documents", "top_n", "return_documents", "user")
FRAME = 3  # [CLS] query [SEP] document [SEP]: the tokens a pair adds to its texts'


def is_cross_encoder(lm) -> bool:
    return lm.config.task == "bert_cls" and lm.model.cfg.num_classes == 1


def kind(lm) -> str:
    """What the served model is, in the words an error uses."""
    if is_cross_encoder(lm):
        return "a reranker (a cross-encoder)"
    return "a chat model (a decoder)" if lm.config.model.family == "gpt" else "an embedding model (an encoder)"


def serves(lm) -> str:
    """The one route an encoder's server (no engine) answers."""
    return "rerank" if is_cross_encoder(lm) else "embeddings"


def refuse_unless_embedder(lm, model_id: str) -> None:
    """/v1/embeddings of a cross-encoder: its vectors would be a classifier's hidden states, not embeddings."""
    if is_cross_encoder(lm):
        raise ApiError(400, f"'{model_id}' is {kind(lm)}: this server answers /v1/rerank only")


def request_of(body: dict, lm, model_id: str, max_documents: int) -> tuple[str, list[str], int, bool]:
    """(query, documents, top_n, return_documents) of a rerank request, each checked; else OpenAI's error."""
    if not is_cross_encoder(lm):
        raise ApiError(400, f"'{model_id}' is {kind(lm)}: /v1/rerank needs a cross-encoder (a bert_cls checkpoint "
                            f"with one output, e.g. ms-marco-MiniLM-L6-v2)", param="model")
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise ApiError(400, f"'{unknown[0]}' is not a field of a rerank request; it takes {', '.join(FIELDS)}",
                       param=unknown[0])
    query = body.get("query")
    if not isinstance(query, str) or not query.strip():
        raise ApiError(400, "'query' must be a non-empty string", param="query")
    given = body.get("documents")
    if not isinstance(given, list) or not given:
        raise ApiError(400, "'documents' must be a non-empty list of strings or {\"text\": ...} objects",
                       param="documents")
    docs = []
    for i, d in enumerate(given):
        text = d.get("text") if isinstance(d, dict) else d
        if not isinstance(text, str) or not text.strip():
            raise ApiError(400, f"documents[{i}] must be a non-empty string or {{\"text\": a non-empty string}}",
                           param="documents")
        docs.append(text)
    if len(docs) > max_documents:
        raise ApiError(413, f"'documents' holds {len(docs)} documents; this server takes at most {max_documents} a "
                            f"request (--max-prompts)", param="documents", code="too_many_inputs")
    top_n = _field(body, "top_n", int, 0, check=lambda v: v >= 0, what="a whole number >= 0 (0: every document)")
    keep = _field(body, "return_documents", bool, True, what="true or false")
    return query, docs, top_n, keep


def response(lm, query: str, docs: list[str], top_n: int, keep: bool, model_id: str) -> dict:
    """The ranking (a worker thread's job: it runs the model); a pair longer than the model is a 400 naming it."""
    from zoo.errors import ZooError
    try:
        ranked = lm.rerank(query, docs, top_k=top_n or None)
    except ZooError as e:  # a pair over max_len: the model's own words
        raise ApiError(400, str(e), param="documents") from None
    n_query = len(lm.tokenizer.encode(query))
    tokens = sum(n_query + len(x) + FRAME for x in lm.tokenizer.encode_batch(docs))
    results = [{"index": r["corpus_id"], "relevance_score": r["score"],
                **({"document": {"text": docs[r["corpus_id"]]}} if keep else {})} for r in ranked]
    return {"id": f"rerank-{uuid.uuid4().hex}", "model": model_id, "results": results,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def install(app, *, lm, model_id: str, body_of, lock: asyncio.Lock, max_documents: int) -> None:
    """POST /v1/rerank on `app` (zoo.serve.app.create_app's): `body_of` reads and checks the body as every route's."""
    @app.post("/v1/rerank")
    async def rerank(request: Request):
        body = await body_of(request, {})
        query, docs, top_n, keep = request_of(body, lm, model_id, max_documents)
        async with lock:
            return await asyncio.to_thread(response, lm, query, docs, top_n, keep, model_id)
