"""zoo-serve's HTTP API, OpenAI's shape (FastAPI): the handlers parse and check a request, hand its sequences to the
one engine (zoo.engine.batching) and stream or gather what comes back; nothing here touches the model.

    GET  /health                 {"status": "ok", "model", "slots", "active", "waiting"} (no key needed)
    GET  /v1/models              the model served and its adapters (zoo.serve.adapters: `model` picks one; admin
                                 routes load and unload them)
    POST /v1/chat/completions    messages (rendered with the checkpoint's chat template), max_tokens (or
                                 max_completion_tokens), temperature (default 1), top_p, top_k, seed, stop, n, stream,
                                 response_format (json_object, json_schema: zoo.infer.grammar's token mask),
                                 tools, tool_choice, parallel_tool_calls (and the legacy functions, function_call):
                                 zoo.serve.tools
    POST /v1/completions         prompt (a string or a list of them), the same settings, logprobs (k: each token's
                                 log-probability and the k likeliest at its position; with echo the prompt's tokens
                                 scored too, as zoo-eval scores them) and echo
    POST /v1/embeddings          input (a string, a list of them, or token ids), encoding_format (float, base64):
                                 zoo.serve.embeddings; an encoder's server (no engine) answers this route alone
    POST /v1/rerank              query, documents, top_n, return_documents (vLLM's and Cohere's shape): a
                                 cross-encoder's server answers this route alone (zoo.serve.rerank)

Every response carries `usage` (prompt, completion and total tokens; a stream in its last chunk). Errors are
OpenAI's shape, {"error": {"message", "type", "param", "code"}}: 400 for a malformed body, a bad value, a field zoo
does not implement (zoo.serve.request_checks.NOT_IMPLEMENTED) or a request for more sequences than the queue holds,
401 for a missing or wrong key, 404 for another model's name or an unknown route, 413 for a body over
`max_request_bytes`, more prompts than `max_prompts` or a prompt longer than the context, 429 when the queue is
full, 503 while the server stops, 500 for a fault of the server (its message names no file of the server's; the
console has the traceback). Token log-probabilities follow zoo-eval's convention: the first token is conditioned on
the tokenizer's BOS (else its end-of-text), not left empty.

Nothing slow runs on the event loop, so /health and the other clients keep their answers coming: a body is read
up to its cap, and a large one parsed, a chat template rendered, long prompts tokenized and a scored response built
in worker threads (small ones stay on the loop, where a thread's hop would cost more than the work), and scoring
runs on the engine's thread a batch at a time between decode chunks.

Around every route: a request id (X-Request-Id), GET /metrics (Prometheus) and a graceful stop that answers new
requests 503 while the running ones finish: zoo.serve.operations, zoo.serve.metrics, zoo.serve.shutdown.
"""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from zoo.errors import ZooError
from zoo.serve import adapters, operations, tools
from zoo.serve.choices import Choice
from zoo.serve.metrics import Metrics
from zoo.serve.request_checks import (CHAT_NOT_IMPLEMENTED, COMPLETION_NOT_IMPLEMENTED, INLINE, ApiError, _field,
                                      parse_json, refuse_not_implemented, response_schema, sampling, without_paths)


def create_app(engine, *, model_id: str, api_key: str | None = None, max_request_bytes: int = 8 << 20,
               max_prompts: int = 256, lm=None, log_requests: bool = False):
    """The FastAPI app serving `engine` (started by zoo.cli.serve): bodies over `max_request_bytes` and completion
    requests of more than `max_prompts` prompts are refused with a 413. An encoder has no engine (None): its `lm`
    answers /v1/embeddings alone. Every request gets an id, is counted in GET /metrics and, with `log_requests`, said
    in a line; `app.state.drain` stops it gracefully (zoo.serve.operations, zoo.serve.shutdown)."""
    from zoo.api import decoder
    from zoo.serve import embeddings, rerank
    app = FastAPI(title="zoo-serve", docs_url=None, redoc_url=None)
    lm = engine.lm if engine is not None else lm
    tok = lm.tokenizer
    tool_format = tools.template_format(lm) if engine is not None else None  # hermes, llama3 or None
    one_at_a_time = asyncio.Lock()  # an encoder's embeddings, without an engine to take turns on
    metrics, app.state.drain = Metrics(engine), operations.Drain()

    def decoding() -> None:
        if engine is None:
            raise ApiError(400, f"'{model_id}' is {rerank.kind(lm)}: this server answers /v1/{rerank.serves(lm)} only")

    @app.exception_handler(ApiError)
    async def api_error(request, e: ApiError):
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(HTTPException)
    async def http_error(request, e: HTTPException):  # routing's 404 and 405, in OpenAI's shape (its words)
        what = "Invalid URL" if e.status_code == 404 else "Method not allowed"
        body = ApiError(e.status_code, f"{what} ({request.method} {request.url.path})").body()
        return JSONResponse(body, status_code=e.status_code, headers=getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def any_error(request, e: Exception):  # a bug, not the client's: the traceback goes to the console only
        return JSONResponse(ApiError(500, f"the server failed ({type(e).__name__}); its console has the details",
                                     "server_error").body(), status_code=500)

    if api_key is not None:  # (zoo.serve.operations.Authorise: no layer at all without a key)
        app.add_middleware(operations.Authorise, api_key=api_key)

    @app.get("/health")
    async def health():
        if engine is None:
            return {"status": "ok", "model": model_id, "serves": rerank.serves(lm)}
        stopping = engine.stopping.is_set() or app.state.drain.stopping
        return {"status": "ok" if not stopping else "stopping", "model": model_id,
                "slots": engine.slots, "active": engine.active(),
                "waiting": engine.waiting.qsize() + len(engine.deferred),
                "chunks": engine.batches, "sequences": engine.admitted, "scored": engine.scored,
                "compiling": sorted(engine.compiling)}

    def too_large(size: int, at_least: bool = False) -> ApiError:
        return ApiError(413, f"the request body is {'over ' if at_least else ''}{size:,} bytes; this server takes at "
                             f"most {max_request_bytes:,} (--max-request-bytes)", code="request_too_large")

    async def body_of(request: Request, refused: dict) -> dict:
        """The body as a JSON object: its size checked before and while it is read, parsed in a worker thread; the
        fields zoo does not implement and another model's name refused."""
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_request_bytes:
            raise too_large(int(declared))
        parts, size = [], 0
        async for part in request.stream():
            size += len(part)
            if size > max_request_bytes:
                raise too_large(max_request_bytes, at_least=True)
            parts.append(part)
        raw = b"".join(parts)
        body = parse_json(raw) if size <= INLINE else await asyncio.to_thread(parse_json, raw)
        request.state.adapter = adapters.slot_of(engine, body.get("model"), model_id)  # the base's 0 or an adapter's
        request.state.model = body["model"] if request.state.adapter else model_id  # what the answer names
        refuse_not_implemented(body, refused)
        return body

    def room(prompt: list[int], max_tokens: int | None, default_max: int) -> int:
        if len(prompt) >= engine.max_len:
            raise ApiError(413, f"the prompt is {len(prompt)} tokens; the model's context holds {engine.max_len}",
                           code="context_length_exceeded")
        if max_tokens is None:
            return min(default_max, engine.max_len - len(prompt))
        if max_tokens < 1 or max_tokens > engine.max_len:
            raise ApiError(400, f"'max_tokens' must be from 1 to the model's context, {engine.max_len}; got "
                                f"{max_tokens}", param="max_tokens")
        return max_tokens

    async def grammar_of(body: dict, calls: tools.Tools | None = None):
        """response_format's schema, or the grammar of the tool calls tool_choice requires, compiled
        (zoo.infer.grammar, in a worker thread: a large vocabulary's first compile takes a second), or None; a
        schema the compiler refuses is a 400 naming the problem."""
        from zoo.infer import grammar
        schema, lark = response_schema(body), calls.grammar() if calls is not None else None
        if lark is not None and schema is not None:
            raise ApiError(400, "'response_format' and a tool_choice that requires a call both constrain the answer; "
                                "send one of them", param="response_format")
        if schema is None and lark is None:
            return None
        compiling = (grammar.compile_schema, schema) if lark is None else (grammar.compile_lark, lark)
        try:
            return await asyncio.to_thread(compiling[0], tok, tuple(int(e) for e in engine.eos), compiling[1])
        except grammar.SchemaError as e:
            raise ApiError(400, str(e), param="response_format" if lark is None else "tools") from None

    def start(prompts: list[list[int]], s: dict, default_max: int, guide=None, model=None) -> tuple[
            list[Choice], asyncio.Queue, list]:
        """Queue n sequences per prompt, each with its own matcher of `guide` (a compiled grammar) if any, running
        the adapter `model` names (its slot looked up just before they queue: one unloaded meanwhile is a 404);
        (their choices, the queue their updates arrive on, the sequences)."""
        from zoo.engine.batching import Sequence
        from zoo.engine.programs import key_data
        if engine.stopping.is_set():
            raise ApiError(503, "the server is stopping", "server_error")
        if len(prompts) * s["n"] > engine.max_queue:  # no retry could ever make room: not a 429
            raise ApiError(400, f"this request asks for {len(prompts) * s['n']} sequences (prompts times n); the "
                                f"server queues at most {engine.max_queue} (--max-queue)",
                           param="n" if s["n"] > 1 else "prompt")
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()
        choices, seqs, adapter = [], [], adapters.slot_of(engine, model, model_id)
        for prompt in prompts:
            max_tokens = room(prompt, s["max_tokens"], default_max)
            for i in range(s["n"]):
                c = Choice(tok, s["stop"], loop, queue)
                seqs.append(Sequence(prompt=prompt, max_tokens=max_tokens, temperature=s["temperature"],
                                     top_k=s["top_k"], top_p=s["top_p"], key=key_data(s["seed"], len(choices)),
                                     emit=c.emit, cancelled=lambda c=c: c.gone, stream=s["stream"],
                                     grammar=guide.matcher() if guide is not None else None, adapter=adapter))
                choices.append(c)
        for q, c in zip(seqs, choices):  # its tokens counted and timed on their way out (GET /metrics)
            q.emit = metrics.watch(c)
        if not engine.submit(seqs):
            raise ApiError(429, f"the server's queue is full ({engine.max_queue} sequences waiting); retry later",
                           "rate_limit_error")
        metrics.prompt_tokens.inc(sum(map(len, prompts)))
        return choices, queue, seqs

    async def gather(choices: list[Choice], queue: asyncio.Queue):
        while not all(c.finish for c in choices):
            await queue.get()

    def usage(prompts: list[list[int]], choices: list[Choice], n: int) -> dict:
        p = sum(len(x) for x in prompts)
        c = sum(len(x.ids) for x in choices)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def stream(kind: str, rid: str, prompts, choices: list[Choice], queue, n: int, request: Request, calls=None):
        created = int(time.time())
        deltas = [tools.Deltas(calls) for _ in choices]  # a chat's tool calls held back until they parse

        def chunk(index: int, piece: dict, finish=None, extra=None):
            if kind == "chat.completion.chunk":
                choice = {"index": index, "delta": piece, "finish_reason": finish}
            else:
                choice = {"index": index, "text": piece.get("content", ""), "finish_reason": finish,
                          "logprobs": None}
            return "data: " + json.dumps({"id": rid, "object": kind, "created": created, "model": request.state.model,
                                          "choices": [choice], **(extra or {})}) + "\n\n"

        async def events():
            try:
                if kind == "chat.completion.chunk":
                    for i in range(len(choices)):
                        yield chunk(i, {"role": "assistant", "content": ""})
                told = set()
                while len(told) < len(choices):
                    c, piece, finish = await queue.get()  # one emit of the engine's: its piece, in order
                    i = choices.index(c)
                    for delta in deltas[i].feed(piece, finish is not None):
                        yield chunk(i, delta)
                    if finish and i not in told:
                        told.add(i)
                        last = len(told) == len(choices)
                        yield chunk(i, {}, deltas[i].finish(finish),
                                    {"usage": usage(prompts, choices, n)} if last else None)
                yield "data: [DONE]\n\n"
            finally:  # a client gone mid-stream: its rows are freed at the next chunk
                for c in choices:
                    c.gone = c.finish is None
        return StreamingResponse(events(), media_type="text/event-stream")

    def render(messages: list, calls: tools.Tools | None) -> list[list[int]]:
        """The conversation's prompt ids (a worker thread's job), with its tools; a template that fails is a 400
        naming no path."""
        try:
            plain = calls is None and not tools.mentions_tools(messages)
            convs = decoder.conversations_of(messages, None)[0] if plain else [tools.conversation(messages)]
        except ZooError as e:
            raise ApiError(400, str(e), param="messages") from None
        try:
            return decoder.prompt_tokens(lm, conversations=convs, tools=calls.tools if calls else None)
        except ZooError as e:
            raise ApiError(400, without_paths(str(e)), param="messages") from None

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        decoding()
        body = await body_of(request, CHAT_NOT_IMPLEMENTED)
        s = sampling(body, None)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "'messages' must be a non-empty list of {role, content} messages", param="messages")
        calls = tools.of(body, tool_format)
        guide = await grammar_of(body, calls)
        prompts = await asyncio.to_thread(render, list(messages), calls)
        choices, queue, _ = start(prompts, s, 256, guide, body.get("model"))
        rid = "chatcmpl-" + operations.request_id()
        if s["stream"]:
            return stream("chat.completion.chunk", rid, prompts, choices, queue, s["n"], request, calls)
        await gather(choices, queue)
        answers = [tools.message(c.text, c.finish, calls) for c in choices]
        return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": request.state.model,
                "choices": [{"index": i, "message": m, "finish_reason": f, "logprobs": None}
                            for i, (m, f) in enumerate(answers)], "usage": usage(prompts, choices, s["n"])}

    def encode(texts: list[str]) -> list[list[int]]:  # a worker thread's job
        prompts = decoder.prompt_tokens(lm, texts)  # as transformers tokenizes them (the checkpoint's BOS first)
        return prompts

    async def score(seqs: list[list[int]], top: bool) -> list:
        """Each sequence scored a batch at a time, each batch one job between the engine's decode chunks."""
        out = [None] * len(seqs)
        jobs = await asyncio.to_thread(lambda: [(idx, engine.score_program([seqs[i] for i in idx], top))
                                                for idx in engine.score_groups([len(x) for x in seqs])])
        for idx, job in jobs:  # the next only once this one is done: two scoring requests take turns
            try:
                done = await asyncio.wrap_future(engine.job(job))
            except RuntimeError as e:
                raise ApiError(503, str(e), "server_error") from None
            for i, r in zip(idx, done):
                out[i] = r
        return out

    @app.post("/v1/completions")
    async def completions(request: Request):
        decoding()
        body = await body_of(request, COMPLETION_NOT_IMPLEMENTED)
        prompt = body.get("prompt")
        texts = [prompt] if isinstance(prompt, str) else prompt
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
            raise ApiError(400, "'prompt' must be a non-empty string or a list of them", param="prompt")
        if len(texts) > max_prompts:
            raise ApiError(413, f"'prompt' holds {len(texts)} prompts; this server takes at most {max_prompts} a "
                                f"request (--max-prompts)", param="prompt", code="too_many_prompts")
        echo = _field(body, "echo", bool, False, what="true or false")
        logprobs = _field(body, "logprobs", int, None, lambda v: 0 <= v <= 5, "a whole number from 0 to 5")
        asked = body.get("max_tokens", 16)
        if echo and asked == 0:  # scoring the prompt alone, as a harness does
            body = {**body, "max_tokens": None}
        s = sampling(body, 16)
        if body.get("best_of") not in (None, s["n"]):
            raise ApiError(400, f"'best_of' is not implemented by zoo-serve beyond n (got "
                                f"{json.dumps(body['best_of'])[:80]}); leave it out", param="best_of",
                           code="unsupported_parameter")
        if logprobs is not None:
            adapters.base_only(request, "'logprobs' (scoring)")
        if s["stream"] and (echo or logprobs is not None):
            raise ApiError(400, "'echo' and 'logprobs' need stream false", param="stream")
        guide = await grammar_of(body)
        small = sum(map(len, texts)) <= INLINE  # a thread's hop costs more than a short prompt's encoding
        prompts = encode(texts) if small else await asyncio.to_thread(encode, texts)
        rid = "cmpl-" + operations.request_id()
        if echo and asked == 0:
            for p in prompts:
                room(p, 1, 1)
            choices = []
            metrics.prompt_tokens.inc(sum(map(len, prompts)))
        else:
            choices, queue, _ = start(prompts, s, 16, guide, body.get("model"))
            if s["stream"]:
                return stream("text_completion", rid, prompts, choices, queue, s["n"], request)
            await gather(choices, queue)
        rows = [(p, choices[k * s["n"] + j] if choices else None) for k, p in enumerate(prompts)
                for j in range(s["n"] if choices else 1)]
        scored = None
        if logprobs is not None:
            scored = await score([p + (c.ids if c else []) for p, c in rows], top=logprobs > 0)
        usage_ = usage(prompts, choices, s["n"])
        answer = (completion_response, tok, rid, request.state.model, rows, scored, echo, logprobs, usage_)
        return answer[0](*answer[1:]) if small and scored is None else await asyncio.to_thread(*answer)

    @app.post("/v1/embeddings")
    async def embed(request: Request):
        body = await body_of(request, {})
        adapters.base_only(request, "/v1/embeddings")
        rerank.refuse_unless_embedder(lm, model_id)
        texts = embeddings.texts_of(body, max_prompts)
        if engine is None:
            async with one_at_a_time:
                vectors = await asyncio.to_thread(embeddings.vectors, lm, texts)
        else:  # between two decode chunks, on the engine's thread
            try:
                vectors = await asyncio.wrap_future(engine.job(lambda: embeddings.vectors(lm, texts)))
            except RuntimeError as e:
                raise ApiError(503, str(e), "server_error") from None
        return await asyncio.to_thread(embeddings.response, lm, body, texts, vectors, model_id)

    adapters.install(app, engine, model_id=model_id, api_key=api_key, body_of=body_of)  # /v1/models, admin routes
    rerank.install(app, lm=lm, model_id=model_id, body_of=body_of, lock=one_at_a_time, max_documents=max_prompts)
    operations.install(app, metrics, app.state.drain, log_requests)  # the last: its route counts by name
    return app


def completion_response(tok, rid: str, model_id: str, rows: list, scored, echo: bool, k: int | None,
                        usage: dict) -> JSONResponse:
    """/v1/completions' answer, rendered to JSON (a worker thread's job: a long scored answer is much Python).
    `rows` are (prompt ids, its Choice or None), `scored` their (log-probabilities, top values, top ids) or None.
    logprobs are OpenAI's legacy shape: tokens, token_logprobs, top_logprobs (per position the k likeliest tokens'
    texts and log-probabilities, and the chosen one's: up to k + 1) and text_offset."""
    out = []
    for i, (p, c) in enumerate(rows):
        ids = (p if echo else []) + (c.ids if c else [])
        entry = {"index": i, "text": (tok.decode(p) if echo else "") + (c.text if c else ""),
                 "finish_reason": c.finish if c else "length", "logprobs": None}
        if scored is not None:
            lp, vals, top_ids = scored[i]
            skip = 0 if echo else len(p)
            pieces = [tok.decode([t]) for t in ids]
            tops = []
            for j, piece in enumerate(pieces):
                if np.isnan(lp[skip + j]):  # the tokenizer's own BOS, conditioned on nothing: no number, as vLLM
                    tops.append(None)
                    continue
                best = {}
                for v, t in zip(vals[skip + j, :k], top_ids[skip + j, :k]) if k else ():  # likeliest first
                    best.setdefault(tok.decode([int(t)]), float(v))
                best[piece] = float(lp[skip + j])  # the chosen token's number is token_logprobs' own
                tops.append(best)
            offsets = np.cumsum([0] + [len(x) for x in pieces])[:-1]
            entry["logprobs"] = {"tokens": pieces,
                                 "token_logprobs": [None if np.isnan(x) else float(x) for x in lp[skip:]],
                                 "top_logprobs": tops, "text_offset": [int(x) for x in offsets]}
        out.append(entry)
    return JSONResponse({"id": rid, "object": "text_completion", "created": int(time.time()), "model": model_id,
                         "choices": out, "usage": usage})
