"""zoo-serve's HTTP API, OpenAI's shape (FastAPI): the handlers parse and check a request, hand its sequences to the
one engine (zoo.serve.engine) and stream or gather what comes back; nothing here touches the model.

    GET  /health                 {"status": "ok", "model", "slots", "active", "waiting"} (no key needed)
    GET  /v1/models              the one model served
    POST /v1/chat/completions    messages (rendered with the checkpoint's chat template), max_tokens (or
                                 max_completion_tokens), temperature (default 1), top_p, top_k, seed, stop, n, stream
    POST /v1/completions         prompt (a string or a list of them), the same settings, logprobs (with echo: the
                                 prompt's tokens scored too, as zoo-eval scores them) and echo

Every response carries `usage` (prompt, completion and total tokens; a stream in its last chunk). Errors are
OpenAI's shape, {"error": {"message", "type", "param", "code"}}: 400 for a malformed body, a bad value or a
max_tokens the context cannot hold, 401 for a missing or wrong key, 413 for a prompt longer than the context, 429
when the queue is full, 503 while the server stops. Token log-probabilities follow zoo-eval's convention: the first
token is conditioned on the tokenizer's BOS (else its end-of-text), not left empty.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from zoo.errors import ZooError

MAX_N = 8  # completions a request may ask for


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def _field(body: dict, name: str, kinds, default=None, check=None, what: str = ""):
    """body[name] checked: of one of `kinds` (bool is no number), and check(value) true; else a 400 naming it."""
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise ApiError(400, f"'{name}' must be {what}; got {json.dumps(value)}", param=name)
    if not isinstance(value, kinds) or (check is not None and not check(value)):
        raise ApiError(400, f"'{name}' must be {what}; got {json.dumps(value)[:80]}", param=name)
    return value


def sampling(body: dict, default_max: int | None) -> dict:
    """The settings every completion request shares, checked."""
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop
    if stops is not None and (not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops)
                              or len(stops) > 4):
        raise ApiError(400, "'stop' must be a string or a list of at most 4 non-empty strings", param="stop")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    return {
        "max_tokens": _field({"max_tokens": max_tokens}, "max_tokens", int, default_max, what="a whole number of tokens"),
        "temperature": float(_field(body, "temperature", (int, float), 1.0, lambda v: 0 <= v <= 2,
                                    "a number between 0 and 2")),
        "top_p": float(_field(body, "top_p", (int, float), 1.0, lambda v: 0 < v <= 1, "a number in (0, 1]")),
        "top_k": _field(body, "top_k", int, 0, lambda v: v >= 0, "a whole number >= 0 (0: off)"),
        "seed": _field(body, "seed", int, 0, lambda v: 0 <= v < 2 ** 31, "a whole number >= 0"),
        "n": _field(body, "n", int, 1, lambda v: 1 <= v <= MAX_N, f"a whole number from 1 to {MAX_N}"),
        "stream": _field(body, "stream", bool, False, what="true or false"),
        "stop": stops or [],
    }


class Choice:
    """One completion: the ids the engine hands out, the text so far (cut at a stop string) and how it ended."""

    def __init__(self, tokenizer, stops: list[str], loop, queue: asyncio.Queue):
        self.tok, self.stops, self.loop, self.queue = tokenizer, stops, loop, queue
        self.ids: list[int] = []
        self.text, self.sent, self.finish, self.gone = "", 0, None, False

    def emit(self, ids: list[int], finish: str | None) -> bool:
        """Engine thread: new ids (and the finish reason at the end); True when a stop string ended it early."""
        self.ids += ids
        text = self.tok.decode(self.ids)
        ends = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        stopped = bool(ends)
        if stopped:
            text, finish = text[:min(ends)], "stop"
        self.text = text
        if finish is not None:
            self.finish = finish
        self.loop.call_soon_threadsafe(self.queue.put_nowait, self)
        return stopped

    def pending(self) -> str:
        """The text not sent yet, less what could still become a stop string or a half-decoded character."""
        end = len(self.text)
        if self.finish is None:
            hold = max((len(s) - 1 for s in self.stops), default=0)
            end = max(self.sent, len(self.text.rstrip("\ufffd")) - hold)
        piece, self.sent = self.text[self.sent:end], max(self.sent, end)
        return piece


def create_app(engine, *, model_id: str, api_key: str | None = None):
    """The FastAPI app serving `engine` (started by zoo.cli.serve)."""
    app = FastAPI(title="zoo-serve", docs_url=None, redoc_url=None)
    lm, tok = engine.lm, engine.lm.tokenizer

    @app.exception_handler(ApiError)
    async def api_error(request, e: ApiError):
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(Exception)
    async def any_error(request, e: Exception):  # a bug, not the client's: said in the OpenAI shape too
        return JSONResponse(ApiError(500, f"{type(e).__name__}: {e}", "server_error").body(), status_code=500)

    @app.middleware("http")
    async def authorise(request: Request, call_next):
        if api_key is not None and request.url.path != "/health":
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                e = ApiError(401, "a missing or wrong API key: send 'Authorization: Bearer KEY'", "authentication_error",
                             code="invalid_api_key")
                return JSONResponse(e.body(), status_code=401)
        return await call_next(request)

    @app.get("/health")
    async def health():
        return {"status": "ok" if not engine.stopping.is_set() else "stopping", "model": model_id,
                "slots": engine.slots, "active": engine.active(), "waiting": engine.waiting.qsize(),
                "chunks": engine.batches, "sequences": engine.admitted}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_id, "object": "model", "created": int(time.time()),
                                            "owned_by": "zoo"}]}

    async def body_of(request: Request) -> dict:
        try:
            body = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(400, f"the request body is not JSON ({e})") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
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

    def start(prompts: list[list[int]], s: dict, default_max: int) -> tuple[list[Choice], asyncio.Queue, list]:
        """Queue n sequences per prompt; (their choices, the queue their updates arrive on, the sequences)."""
        from zoo.serve.engine import Sequence, key_data
        if engine.stopping.is_set():
            raise ApiError(503, "the server is stopping", "server_error")
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()
        choices, seqs = [], []
        for prompt in prompts:
            max_tokens = room(prompt, s["max_tokens"], default_max)
            for i in range(s["n"]):
                c = Choice(tok, s["stop"], loop, queue)
                seqs.append(Sequence(prompt=prompt, max_tokens=max_tokens, temperature=s["temperature"],
                                     top_k=s["top_k"], top_p=s["top_p"], key=key_data(s["seed"], len(choices)),
                                     emit=c.emit, cancelled=lambda c=c: c.gone))
                choices.append(c)
        if not engine.submit(seqs):
            raise ApiError(429, f"the server's queue is full ({engine.max_queue} sequences waiting); retry later",
                           "rate_limit_error")
        return choices, queue, seqs

    async def gather(choices: list[Choice], queue: asyncio.Queue):
        while not all(c.finish for c in choices):
            await queue.get()

    def usage(prompts: list[list[int]], choices: list[Choice], n: int) -> dict:
        p = sum(len(x) for x in prompts)
        c = sum(len(x.ids) for x in choices)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def stream(kind: str, rid: str, prompts, choices: list[Choice], queue, n: int, request: Request):
        created = int(time.time())

        def chunk(index: int, piece: dict, finish=None, extra=None):
            if kind == "chat.completion.chunk":
                choice = {"index": index, "delta": piece, "finish_reason": finish}
            else:
                choice = {"index": index, "text": piece.get("content", ""), "finish_reason": finish,
                          "logprobs": None}
            return "data: " + json.dumps({"id": rid, "object": kind, "created": created, "model": model_id,
                                          "choices": [choice], **(extra or {})}) + "\n\n"

        async def events():
            try:
                if kind == "chat.completion.chunk":
                    for i in range(len(choices)):
                        yield chunk(i, {"role": "assistant", "content": ""})
                told = set()
                while len(told) < len(choices):
                    c = await queue.get()
                    i = choices.index(c)
                    piece = c.pending()
                    if piece:
                        yield chunk(i, {"content": piece})
                    if c.finish and i not in told:
                        told.add(i)
                        last = len(told) == len(choices)
                        yield chunk(i, {}, c.finish, {"usage": usage(prompts, choices, n)} if last else None)
                yield "data: [DONE]\n\n"
            finally:  # a client gone mid-stream: its rows are freed at the next chunk
                for c in choices:
                    c.gone = c.finish is None
        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        from zoo.api import decoder
        body = await body_of(request)
        s = sampling(body, None)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "'messages' must be a non-empty list of {role, content} messages", param="messages")
        try:
            convs, _ = decoder.conversations_of(list(messages), None)
        except ZooError as e:
            raise ApiError(400, str(e), param="messages") from None
        prompts = decoder.prompt_tokens(lm, conversations=convs)
        choices, queue, _ = start(prompts, s, 256)
        rid = "chatcmpl-" + uuid.uuid4().hex[:24]
        if s["stream"]:
            return stream("chat.completion.chunk", rid, prompts, choices, queue, s["n"], request)
        await gather(choices, queue)
        return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model_id,
                "choices": [{"index": i, "message": {"role": "assistant", "content": c.text},
                             "finish_reason": c.finish, "logprobs": None} for i, c in enumerate(choices)],
                "usage": usage(prompts, choices, s["n"])}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await body_of(request)
        prompt = body.get("prompt")
        texts = [prompt] if isinstance(prompt, str) else prompt
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
            raise ApiError(400, "'prompt' must be a non-empty string or a list of them", param="prompt")
        echo = _field(body, "echo", bool, False, what="true or false")
        logprobs = _field(body, "logprobs", int, None, lambda v: 0 <= v <= 5, "a whole number from 0 to 5")
        asked = body.get("max_tokens", 16)
        if echo and asked == 0:  # scoring the prompt alone, as a harness does
            body = {**body, "max_tokens": None}
        s = sampling(body, 16)
        prompts = decoder.prompt_tokens(lm, texts)  # as transformers tokenizes them (the checkpoint's BOS first)
        rid = "cmpl-" + uuid.uuid4().hex[:24]
        if echo and asked == 0:
            if s["stream"]:
                raise ApiError(400, "'stream' with max_tokens 0 has nothing to stream", param="stream")
            for p in prompts:
                room(p, 1, 1)
            choices = []
        else:
            choices, queue, _ = start(prompts, s, 16)
            if s["stream"]:
                if echo or logprobs is not None:
                    raise ApiError(400, "'echo' and 'logprobs' need stream false", param="stream")
                return stream("text_completion", rid, prompts, choices, queue, s["n"], request)
            await gather(choices, queue)
        rows = [(p, choices[k * s["n"] + j] if choices else None) for k, p in enumerate(prompts)
                for j in range(s["n"] if choices else 1)]
        scored = None
        if logprobs is not None:  # scored between decode chunks, on the engine's thread
            seqs = [p + (c.ids if c else []) for p, c in rows]
            scored = await asyncio.get_running_loop().run_in_executor(None, engine.run_job, lambda: _score(lm, seqs))
        out = []
        for i, (p, c) in enumerate(rows):
            ids = (p if echo else []) + (c.ids if c else [])
            entry = {"index": i, "text": (tok.decode(p) if echo else "") + (c.text if c else ""),
                     "finish_reason": c.finish if c else "length", "logprobs": None}
            if scored is not None:
                lp = scored[i][0 if echo else len(p):]
                pieces = [tok.decode([t]) for t in ids]
                offsets = np.cumsum([0] + [len(x) for x in pieces])[:-1]
                entry["logprobs"] = {"tokens": pieces, "token_logprobs": [float(x) for x in lp], "top_logprobs": None,
                                     "text_offset": [int(x) for x in offsets]}
            out.append(entry)
        usage_ = {"prompt_tokens": sum(map(len, prompts)), "completion_tokens": sum(len(c.ids) for c in choices)}
        usage_["total_tokens"] = usage_["prompt_tokens"] + usage_["completion_tokens"]
        return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model_id,
                "choices": out, "usage": usage_}

    return app


def _score(lm, seqs: list[list[int]]) -> list[np.ndarray]:
    """Each token's log-probability of each id sequence (zoo-eval's convention), on the engine's thread."""
    from zoo.eval.loglik import prefix_token
    from zoo.eval.perplexity import document_token_logprobs
    model, params = lm.decoding()
    window = lm.config.window
    return document_token_logprobs(model, params, seqs, prefix=prefix_token(lm.tokenizer), context=window,
                                   stride=max(1, window // 2))
