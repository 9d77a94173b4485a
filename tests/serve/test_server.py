"""zoo-serve, tested with real clients against a live server this test starts (a tiny run, 4 slots, an API key):
the openai client's greedy chat completion equals zoo-sample --chat token for token; streamed chunks join into the
non-streamed answer; n=2 with a seed is reproducible; 16 concurrent requests all answer as they do alone, decoded in
fewer batches than requests; /v1/completions' log-probabilities equal zoo-eval's per token; bad requests and
faults get OpenAI's error shape and the right status, and the server goes on serving; Ctrl-C stops it in 2 s."""

import concurrent.futures as cf
import json
import signal
import subprocess
import sys
import time

import pytest

openai = pytest.importorskip("openai", reason="the openai client is a test extra")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi", reason="zoo-serve needs the serve extra")

from tests.helpers import processes  # noqa: E402
from tests.helpers.shared_runs import finished_gpt_fixture  # noqa: E402,F401
from zoo.cli import sample  # noqa: E402

KEY = "sk-test"
QUESTION = [{"role": "user", "content": "Hi?"}]  # the run's window is 32 tokens: room for the answer


@pytest.fixture(scope="module")
def server(finished_gpt):
    """(base URL, the process) of `zoo-serve RUN` on a free port, once it answers /health."""
    port = processes.free_port()
    p = subprocess.Popen([sys.executable, "-m", "zoo.cli.serve", finished_gpt, "--port", str(port), "--slots", "4",
                          "--api-key", KEY, "--max-queue", "32"], cwd=processes.ROOT, env=processes.environment(1),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            assert p.poll() is None, p.communicate()[1][-2000:]
            time.sleep(0.2)
    yield url, p
    if p.poll() is None:
        p.kill()


def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)


def health(url):
    return httpx.get(url + "/health").json()


def test_greedy_chat_equals_zoo_sample_and_streams_into_the_same_answer(server, finished_gpt, capsys):
    url, _ = server
    c = client(url)
    r = c.chat.completions.create(model="run", messages=QUESTION, max_tokens=4, temperature=0)
    assert sample.main([finished_gpt, "--chat", "--prompt", QUESTION[0]["content"], "--temperature", "0",
                        "--max-new-tokens", "4"]) == 0
    assert r.choices[0].message.content + "\n" == capsys.readouterr().out
    assert r.usage.completion_tokens == 4 and r.usage.prompt_tokens > 10 and r.choices[0].finish_reason == "length"
    pieces = [ch.choices[0].delta.content or "" for ch in
              c.chat.completions.create(model="run", messages=QUESTION, max_tokens=4, temperature=0, stream=True)
              if ch.choices]
    assert "".join(pieces) == r.choices[0].message.content
    whole = c.completions.create(model="run", prompt="The", max_tokens=20, temperature=0).choices[0].text
    parts = [ch.choices[0].text for ch in c.completions.create(model="run", prompt="The", max_tokens=20,
                                                                temperature=0, stream=True) if ch.choices]
    assert "".join(parts) == whole and len([p for p in parts if p]) >= 2  # a chunk of 8 tokens at a time
    assert [m.id for m in c.models.list().data] == ["run"]


def test_n_samples_with_a_seed_are_reproducible(server):
    c = client(server[0])
    ask = lambda seed: [x.text for x in c.completions.create(model="run", prompt="The", max_tokens=10,  # noqa: E731
                                                            temperature=1.0, seed=seed, n=2).choices]
    first = ask(7)
    assert ask(7) == first and first[0] != first[1] and ask(8) != first


def test_concurrent_requests_answer_as_alone_in_fewer_batches(server):
    url, _ = server
    c = client(url)
    prompts = [f"Hello {i}" for i in range(16)]
    alone = {p: c.completions.create(model="run", prompt=p, max_tokens=8, temperature=0).choices[0].text
             for p in prompts[:3]}
    before = health(url)
    with cf.ThreadPoolExecutor(16) as ex:
        got = list(ex.map(lambda p: c.completions.create(model="run", prompt=p, max_tokens=8, temperature=0)
                          .choices[0].text, prompts))
    after = health(url)
    assert all(got[i] == alone[p] for i, p in enumerate(prompts[:3])) and all(len(g) for g in got)
    assert after["sequences"] - before["sequences"] == 16
    assert after["chunks"] - before["chunks"] < 16  # 4 slots: about 16 / 4 chunks of 8 tokens, not one per request


def test_completion_logprobs_equal_zoo_evals(server, finished_gpt):
    import zoo
    text = "The for statement iterates"
    r = client(server[0]).completions.create(model="run", prompt=text, max_tokens=0, echo=True, logprobs=1)
    lp = r.choices[0].logprobs
    want = zoo.load(finished_gpt).logprobs(text)
    assert "".join(lp.tokens) == text and r.choices[0].text == text
    assert lp.token_logprobs == pytest.approx(want.tolist(), abs=1e-5) and all(x < 0 for x in lp.token_logprobs)


BAD = [  # (what, the request (method, path, body or raw bytes, headers), status, a piece of the message)
    ("malformed JSON", ("/v1/chat/completions", b"{not json", {}), 400, "not JSON"),
    ("a wrong type", ("/v1/completions", {"prompt": "x", "max_tokens": "ten"}, {}), 400, "'max_tokens' must be"),
    ("a wrong type for temperature", ("/v1/completions", {"prompt": "x", "temperature": "hot"}, {}), 400,
     "'temperature' must be"),
    ("empty messages", ("/v1/chat/completions", {"messages": []}, {}), 400, "'messages' must be a non-empty list"),
    ("a message without content", ("/v1/chat/completions", {"messages": [{"role": "user"}]}, {}), 400, "content"),
    ("max_tokens above the context", ("/v1/completions", {"prompt": "x", "max_tokens": 100000}, {}), 400,
     "'max_tokens' must be from 1 to the model's context"),
    ("max_tokens of 0", ("/v1/completions", {"prompt": "x", "max_tokens": 0}, {}), 400, "'max_tokens' must be"),
    ("a prompt longer than the context", ("/v1/completions", {"prompt": "x" * 5000}, {}), 413, "context holds"),
    ("a wrong API key", ("/v1/completions", {"prompt": "x"}, {"Authorization": "Bearer nope"}), 401, "API key"),
    ("no API key", ("/v1/models", None, {"Authorization": ""}), 401, "API key"),
]


@pytest.mark.parametrize("what, request_, status, piece", BAD, ids=[b[0] for b in BAD])
def test_bad_requests_get_openais_error_shape_and_the_server_goes_on(server, what, request_, status, piece):
    url, _ = server
    path, body, headers = request_
    headers = {"Authorization": f"Bearer {KEY}", **headers}
    if body is None:
        r = httpx.get(url + path, headers=headers)
    elif isinstance(body, bytes):
        r = httpx.post(url + path, content=body, headers=headers)
    else:
        r = httpx.post(url + path, json=body, headers=headers)
    error = r.json()["error"]
    assert r.status_code == status and piece in error["message"] and set(error) == {"message", "type", "param", "code"}
    assert client(url).completions.create(model="run", prompt="ok", max_tokens=2).usage.completion_tokens == 2


def test_a_client_gone_mid_stream_frees_its_row_and_a_flood_is_turned_away_with_429(server):
    url, _ = server
    with httpx.stream("POST", url + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                      json={"prompt": "The", "max_tokens": 40, "stream": True, "temperature": 0}) as r:
        next(r.iter_lines())  # one chunk, then gone
    for _ in range(50):
        if health(url)["active"] == 0:
            break
        time.sleep(0.1)
    assert health(url)["active"] == 0
    body = {"prompt": "The", "max_tokens": 20}

    def post(_):
        return httpx.post(url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"},
                          timeout=120)
    with cf.ThreadPoolExecutor(64) as ex:
        codes = [r.status_code for r in ex.map(post, range(200))]
    assert set(codes) <= {200, 429} and codes.count(200) >= 32 and 429 in codes
    turned = next(r for r in [post(0) for _ in range(1)])  # afterwards: served again
    assert turned.status_code == 200 and json.loads(turned.text)["usage"]["completion_tokens"] >= 1


def test_ctrl_c_stops_the_server_within_two_seconds(server):
    url, p = server
    t = time.perf_counter()
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=10)
    assert time.perf_counter() - t < 2.0 and p.returncode == 0
    assert "Traceback" not in err, err[-2000:]
