"""zoo.bench.serve's open loop (--rates): Poisson arrival times, each request sent as it arrives whatever is still
running, and the table keyed by the offered rate."""

import http.server
import json
import statistics
import threading
import time

import pytest

from zoo.bench import serve


def test_arrivals_are_a_seeded_poisson_process_of_the_rate():
    times = serve.arrivals(4.0, 500.0, seed=3)
    assert times == serve.arrivals(4.0, 500.0, seed=3)  # every server gets the same arrivals
    assert times != serve.arrivals(4.0, 500.0, seed=4)
    assert all(0 < a < b < 500 for a, b in zip(times, times[1:]))
    assert len(times) == pytest.approx(2000, rel=0.1)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert statistics.mean(gaps) == pytest.approx(0.25, rel=0.1)
    assert statistics.pstdev(gaps) == pytest.approx(0.25, rel=0.15)  # exponential: the spread equals the mean
    with pytest.raises(ValueError, match="must be positive"):
        serve.arrivals(0, 10)


class _Slow(http.server.BaseHTTPRequestHandler):
    """A streamed completion of 3 tokens that takes HOLD seconds, as an OpenAI server streams one."""
    HOLD = 0.6
    running, most = 0, 0
    lock = threading.Lock()

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        with _Slow.lock:
            _Slow.running += 1
            _Slow.most = max(_Slow.most, _Slow.running)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(3):
            time.sleep(_Slow.HOLD / 3)
            chunk = {"choices": [{"text": f"t{i}"}], "usage": {"completion_tokens": i + 1} if i == 2 else None}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")
        with _Slow.lock:
            _Slow.running -= 1

    def log_message(self, *args):
        pass


def test_an_open_loop_sends_each_request_as_it_arrives_and_awaits_them_all():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        row = serve.load_at_rate(url, 10.0, 2.0, max_tokens=3)
    finally:
        httpd.shutdown()
    sent = len(serve.arrivals(10.0, 2.0))
    assert row["rate"] == 10.0 and row["requests"] == sent  # every arrival sent and awaited
    assert _Slow.most >= 3  # requests overlapped: a closed loop of one client would have held one at a time
    assert row["tokens_per_s"] == pytest.approx(3 * sent / (2.0 + _Slow.HOLD), rel=0.3)
    assert _Slow.HOLD / 3 <= row["ttft_p50_s"] < _Slow.HOLD


def test_the_table_of_an_open_loop_is_keyed_by_the_offered_rate():
    row = {"requests": 10, "requests_per_s": 2.0, "tokens_per_s": 64.0, "ttft_p50_s": 0.1, "ttft_p95_s": 0.2}
    text = serve.table([{"server": "zoo-serve", "rate": 2.0, **row},
                        {"server": "vllm", "rate": 2.0, **row, "tokens_per_s": 32.0}])
    assert text.splitlines()[0].startswith("| requests/s offered | zoo-serve requests/s")
    assert text.splitlines()[2] == "| 2 | 2.00 | 64 | 0.10 / 0.20 | 2.00 | 32 | 0.10 / 0.20 | 2.00 |"


def test_rates_and_clients_are_refused_unless_positive_numbers(capsys):
    for argv in (["x", "--rates", "0,1"], ["x", "--rates", "fast"], ["x", "--clients", "8,x"]):
        with pytest.raises(SystemExit):
            serve.main(argv)
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert argv[1] in err and "a comma list of numbers above 0" in err
