"""zoo-serve's graceful shutdown (zoo.serve.shutdown) against a server of its own (the tiny run, 2 slots): at
SIGTERM a streaming request already running finishes whole while a new one is answered 503 in OpenAI's shape; a
second signal cuts what still runs, said in one line, and the command exits 0; the requests' log lines carry their
ids. The decision at each tick (done, late, cut) without a process: the deadline itself."""

import asyncio
import signal
import subprocess
import sys
import threading
import time

import httpx
import uvicorn

from tests.helpers import processes
from tests.helpers.shared_runs import finished_gpt_fixture  # noqa: F401
from zoo.serve import operations, shutdown

STREAM = (b'{"prompt": "The", "max_tokens": 20, "temperature": 0, ', b'"stream": true}')  # sent in two parts


def slow_body(parts, go: threading.Event):
    """A request body sent chunked: its first part now, the rest once `go` is set (the request runs meanwhile)."""
    yield parts[0]
    go.wait(120)
    yield parts[1]


def gauge(url, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families
    return next(s.value for f in text_string_to_metric_families(httpx.get(url + "/metrics").text)
                for s in f.samples if s.name == name)


def test_sigterm_finishes_a_running_stream_refuses_new_requests_and_a_second_signal_cuts(finished_gpt, tmp_path):
    port, out, err = processes.free_port(), tmp_path / "out.txt", tmp_path / "err.txt"
    with open(out, "w") as o, open(err, "w") as e:  # files, not pipes: nobody reads them while it runs
        p = subprocess.Popen([sys.executable, "-m", "zoo.cli.serve", finished_gpt, "--port", str(port), "--slots", "2",
                              "--log-requests", "--shutdown-timeout", "300"], cwd=processes.ROOT,
                             env=processes.environment(1), stdout=o, stderr=e)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                assert p.poll() is None, err.read_text()[-2000:]
                time.sleep(0.2)
        go, never, got = threading.Event(), threading.Event(), {}

        def stream():  # runs at SIGTERM: its body's last part is sent after it
            with httpx.stream("POST", url + "/v1/completions", content=slow_body(STREAM, go), timeout=120,
                              headers={"X-Request-Id": "drain-stream"}) as r:
                got["stream"] = (r.status_code, r.headers["x-request-id"], list(r.iter_lines()))

        def stuck():  # its body never ends: still running at the second signal
            try:
                got["stuck"] = httpx.post(url + "/v1/completions", content=slow_body(STREAM, never), timeout=120)
            except httpx.HTTPError as e:
                got["stuck"] = e
        threads = [threading.Thread(target=f) for f in (stream, stuck)]
        for t in threads:
            t.start()
        for _ in range(600):
            if gauge(url, "zoo_requests_in_progress") == 2:
                break
            time.sleep(0.1)
        p.send_signal(signal.SIGTERM)
        for _ in range(600):
            if httpx.get(url + "/health").json()["status"] == "stopping":
                break
            time.sleep(0.1)
        refused = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2},
                             headers={"X-Request-Id": "drain-late"})
        assert refused.status_code == 503 and refused.headers["x-request-id"] == "drain-late"
        assert refused.json()["error"] == {"message": "the server is stopping; retry on another",
                                           "type": "server_error", "param": None, "code": None}
        go.set()
        threads[0].join(120)
        status, rid, lines = got["stream"]
        events = [line for line in lines if line.startswith("data: ")]
        assert (status, rid, events[-1]) == (200, "drain-stream", "data: [DONE]") and '"finish_reason": "' in events[-2]
        assert p.poll() is None  # the stuck request holds it
        p.send_signal(signal.SIGTERM)
        assert p.wait(60) == 0
    finally:
        never.set()
        if p.poll() is None:
            p.kill()
    threads[1].join(120)
    log = err.read_text()
    assert "zoo-serve: stopping: new requests are answered 503; 2 running may take up to 300 s" in log
    assert "zoo-serve: cut 1 running request at a second signal (--shutdown-timeout)" in log
    assert "zoo-serve: [drain-stream] POST /v1/completions 200 in" in log
    assert "zoo-serve: [drain-late] POST /v1/completions 503 in" in log
    assert "Traceback" not in log, log[-3000:]
    assert out.read_text().endswith("stopped\n")
    stuck = got["stuck"]  # answered 503 (its client may be too busy sending to see it before the connection closes)
    assert isinstance(stuck, httpx.HTTPError) or (stuck.status_code, stuck.json()["error"]["message"]) == (
        503, "the server stopped before this request finished (--shutdown-timeout)")


class Running:
    """A request's task as the drain sees it."""
    cancelled = False

    def cancel(self):
        self.cancelled = True


def test_the_drain_ends_when_nothing_runs_or_at_the_deadline():
    """Each tick: nothing running ends it at once; a request running before the deadline waits; one still running at
    the deadline is cut, said in one line."""
    lines = []
    server = shutdown.Server(uvicorn.Config(app=None), operations.Drain(), timeout=5, log=lines.append)
    tick = lambda: asyncio.run(server.on_tick(1))  # noqa: E731
    assert tick() is False and lines == []  # no signal yet
    server.handle_exit(signal.SIGTERM, None)
    running = Running()
    server.drain.tasks.add(running)
    assert tick() is False and not server.should_exit and not running.cancelled
    server.drain.since -= 5
    assert tick() is True and lines[-1] == "cut 1 running request at the 5 s deadline (--shutdown-timeout)"
    assert running.cancelled and server.drain.cut
    server = shutdown.Server(uvicorn.Config(app=None), operations.Drain(), timeout=5, log=lines.append)
    server.handle_exit(signal.SIGINT, None)
    assert tick() is True and lines[-1] == "stopping: new requests are answered 503"
