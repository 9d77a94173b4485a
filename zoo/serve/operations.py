"""What zoo-serve does around every request, whatever its route (`install` wraps the app in it): its id, its count
and latency in the metrics (zoo.serve.metrics, `GET /metrics`), its log line, and its refusal while the server stops
(zoo.serve.shutdown).

The id is the client's `X-Request-Id` header when it sends a usable one (printable ASCII, no spaces, at most 128
characters), else 32 random hex digits; every response carries it back in `X-Request-Id` (an error's and a 500's
too: this middleware sits outside FastAPI's own error handling), a completion's body `id` is OpenAI's prefix and it
(`chatcmpl-ID`, `cmpl-ID`, as vLLM names them), and zoo-serve's log lines about the request start with it,
`zoo-serve: [ID] ...`, uvicorn's own (a 500's traceback) `[ID] ...`. While the server stops, a request to /v1/ is
answered 503 in OpenAI's shape; /health and /metrics go on answering. With `--api-key`, `Authorise` answers 401 to a
request without the key."""

from __future__ import annotations

import asyncio
import contextvars
import hmac
import logging
import re
import sys
import time
import uuid

from fastapi.responses import JSONResponse

from zoo.serve.request_checks import ApiError

_ID = contextvars.ContextVar("zoo_serve_request_id", default=None)
_USABLE = re.compile(r"[\x21-\x7e]{1,128}")  # printable ASCII without spaces: safe in a header and a log line


def request_id() -> str:
    """The id of the request being answered (in its task or a thread it started); a fresh one outside any."""
    return _ID.get() or uuid.uuid4().hex


def say(line: str) -> None:
    """A line on stderr, `zoo-serve: [ID] line` while a request is answered."""
    rid = _ID.get()
    print(f"zoo-serve: [{rid}] {line}" if rid else f"zoo-serve: {line}", file=sys.stderr, flush=True)


class Drain:
    """Whether the server stops (since when, time.monotonic), the requests to /v1/ it is answering (their tasks,
    kept by this module's middleware on the event loop's thread, where this is read) and whether it cut them."""

    def __init__(self):
        self.since: float | None = None
        self.tasks: set[asyncio.Task] = set()
        self.cut = False

    @property
    def stopping(self) -> bool:
        return self.since is not None

    @property
    def running(self) -> int:
        return len(self.tasks)

    def cut_all(self) -> int:
        """Cancel every request still running: the middleware answers each 503, or ends its stream (no [DONE]), and
        its connection closes. Returns how many."""
        self.cut = True
        for task in self.tasks:
            task.cancel()
        return len(self.tasks)


class _Tagged(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        rid = _ID.get()
        if rid is not None and not getattr(record, "zoo_tagged", False):
            record.msg, record.zoo_tagged = f"[{rid}] {record.msg}", True
        return True


def tag_uvicorn_logs() -> None:
    """uvicorn's lines about a request (a 500's "Exception in ASGI application") start with its id. Called once
    uvicorn has configured its loggers (uvicorn.Config)."""
    log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _Tagged) for f in log.filters):
        log.addFilter(_Tagged())


class Operations:
    """The ASGI middleware (see the module's docstring) around `app`: `metrics` a zoo.serve.metrics.Metrics,
    `drain` a Drain, `routes` the paths counted by name (any other is 'other'), `log_requests`
    a line per request on stderr."""

    def __init__(self, app, metrics, drain, routes: set[str], log_requests: bool = False):
        self.app, self.metrics, self.drain, self.routes, self.log_requests = app, metrics, drain, routes, log_requests

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        rid = given if _USABLE.fullmatch(given) else uuid.uuid4().hex
        _ID.set(rid)  # this request's task (and what it starts) only; its last log lines too, so never reset
        path, t = scope["path"], time.perf_counter()
        work = path.startswith("/v1/")  # what a shutdown waits for, and refuses once it has begun
        sent = {"status": 500, "body": False, "done": False}  # 500 unless a response starts

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                sent["status"] = message["status"]
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", rid.encode())]}
            else:
                sent["body"], sent["done"] = True, not message.get("more_body", False)
            await send(message)
        try:
            if work and self.drain.stopping:
                await refuse("the server is stopping; retry on another", scope, receive, send_with_id)
                return
            task = asyncio.current_task()
            if work:
                self.drain.tasks.add(task)
            try:
                await self.app(scope, receive, send_with_id)
            except asyncio.CancelledError:
                if not (work and self.drain.cut):
                    raise
                if sent["status"] == 500 and not sent["body"]:  # nothing sent yet
                    await refuse("the server stopped before this request finished (--shutdown-timeout)", scope,
                                 receive, send_with_id)
                elif not sent["done"]:  # a stream, cut short: it ends without its [DONE]
                    await send_with_id({"type": "http.response.body", "body": b"", "more_body": False})
            finally:
                self.drain.tasks.discard(task)
        finally:
            seconds, status = time.perf_counter() - t, sent["status"]
            self.metrics.requests.labels(path if path in self.routes else "other", str(status)).inc()
            if work and status == 200 and scope["method"] == "POST":
                self.metrics.latency.observe(seconds)
            if self.log_requests:
                say(f"{scope['method']} {path} {status} in {seconds:.2f} s")


async def refuse(message: str, scope, receive, send) -> None:
    """A 503 in OpenAI's shape, and the connection closed after it."""
    body = ApiError(503, message, "server_error").body()
    await JSONResponse(body, 503, headers={"connection": "close"})(scope, receive, send)


def install(app, metrics, drain, log_requests: bool = False) -> None:
    """Wrap FastAPI `app` (its routes all added) in Operations, outside its error handling, and serve
    `GET /metrics`."""
    from fastapi import Response

    @app.get("/metrics")
    async def metrics_text():
        return Response(metrics.exposition(), media_type=metrics.content_type)

    metrics.in_progress.set_function(lambda: drain.running)
    routes = {r.path for r in app.routes}
    build = app.build_middleware_stack  # FastAPI's stack starts with the 500 handler: this goes around it
    app.build_middleware_stack = lambda: Operations(build(), metrics, drain, routes, log_requests)


class Authorise:
    """A plain ASGI middleware: every request but `GET /health` must send `Authorization: Bearer KEY` (compared in
    constant time), else it is answered 401 in OpenAI's error body. Plain ASGI rather than FastAPI's
    `@app.middleware("http")`, which passes every streamed chunk through a task and a memory stream of its own."""

    def __init__(self, app, api_key: str):
        self.app, self.want = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] != "/health":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.want):
                e = ApiError(401, "a missing or wrong API key: send 'Authorization: Bearer KEY'", "authentication_error",
                             code="invalid_api_key")
                await JSONResponse(e.body(), status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)
