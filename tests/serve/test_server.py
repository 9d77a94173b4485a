"""zoo-serve, tested with real clients against a live server this test starts (a tiny run, 4 slots, an API key,
small caps on bodies and prompts): the openai client's greedy chat completion equals zoo-sample --chat token for
token; streamed chunks join into the non-streamed answer; n=2 with a seed is reproducible; 16 concurrent requests
all answer as they do alone, decoded in fewer batches than requests; /v1/completions' log-probabilities equal
zoo-eval's per token, its top_logprobs are the likeliest tokens, and many prompts are scored a batch at a time;
bad, hostile and unimplemented requests get OpenAI's error shape, the right status and no server path, and the
server goes on serving; /metrics counts exactly what was sent; every response carries its request id; a port in use
and a failing chat template are one `error:` line at start-up; Ctrl-C stops it promptly and cleanly (a shutdown with
requests running: tests/serve/test_shutdown.py)."""

import concurrent.futures as cf
import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import httpx
import jsonschema
import openai
import pytest

import zoo
from tests.helpers import processes
from tests.helpers.shared_runs import finished_gpt_fixture  # noqa: F401
from zoo.cli import sample
from zoo.cli import serve as serve_cli
from zoo.data.chat import DEFAULT_TEMPLATE

KEY = "sk-test"
QUESTION = [{"role": "user", "content": "Hi?"}]  # the run's window is 32 tokens: room for the answer
MAX_BYTES, MAX_PROMPTS = 16384, 8  # the live server's caps: small, so a test's body stays small
# zoo's default template (what zoo-sample renders for the run), failing on one message as a checkpoint's may
FAILING = "{% if messages[-1]['content'] == 'boom' %}{{ raise_exception('no boom here') }}{% endif %}"


def copy_run(finished_gpt, parent, template: str) -> str:
    """A copy of the run named `run`, with `template` as its chat template."""
    run = parent / "run"
    shutil.copytree(finished_gpt, run, ignore=shutil.ignore_patterns(".lock"))
    (run / "chat_template.jinja").write_text(template)
    return str(run)


@pytest.fixture(scope="module")
def server(finished_gpt, tmp_path_factory):
    """(base URL, the process, its run directory) of `zoo-serve RUN` on a free port, once it answers /health: a copy
    of the finished run whose chat template renders as zoo's default but fails on the message 'boom'."""
    run = copy_run(finished_gpt, tmp_path_factory.mktemp("serve"), FAILING + DEFAULT_TEMPLATE)
    port = processes.free_port()
    p = subprocess.Popen([sys.executable, "-m", "zoo.cli.serve", run, "--port", str(port), "--slots", "4",
                          "--api-key", KEY, "--max-queue", "32", "--max-request-bytes", str(MAX_BYTES),
                          "--max-prompts", str(MAX_PROMPTS)], cwd=processes.ROOT, env=processes.environment(1),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            assert p.poll() is None, p.communicate()[1][-2000:]
            time.sleep(0.2)
    yield url, p, run
    if p.poll() is None:
        p.kill()


def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)


def health(url):
    return httpx.get(url + "/health").json()


def test_greedy_chat_equals_zoo_sample_and_streams_into_the_same_answer(server, finished_gpt, capsys):
    url = server[0]
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
    answer = c.completions.create(model="run", prompt="The", max_tokens=20, temperature=0)
    whole, n = answer.choices[0].text, answer.usage.completion_tokens
    parts = [ch.choices[0].text for ch in c.completions.create(model="run", prompt="The", max_tokens=20,
                                                                temperature=0, stream=True) if ch.choices]
    # Token by token, as sampled (a piece waits only for the rest of a half-decoded character): chunks of 8 steps
    # sent these 20 tokens in 4 pieces.
    assert "".join(parts) == whole and n >= 10 and len([p for p in parts if p]) >= n // 2
    assert [m.id for m in c.models.list().data] == ["run"]


def test_n_samples_with_a_seed_are_reproducible(server):
    c = client(server[0])
    ask = lambda seed: [x.text for x in c.completions.create(model="run", prompt="The", max_tokens=10,  # noqa: E731
                                                            temperature=1.0, seed=seed, n=2).choices]
    first = ask(7)
    assert ask(7) == first and first[0] != first[1] and ask(8) != first


def test_concurrent_requests_answer_as_alone_in_fewer_batches(server):
    url = server[0]
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
    # Alone, each request takes 2 decode calls (its first token, then a chunk for the other 7): 32 for 16. Sharing
    # 4 slots takes fewer however the requests arrive (each admission adds a one-step call for its new rows).
    assert after["chunks"] - before["chunks"] < 32


@pytest.fixture(scope="module")
def lm(finished_gpt):
    return zoo.load(finished_gpt)


def test_completion_logprobs_equal_zoo_evals(server, lm):
    text = "The for statement iterates"
    r = client(server[0]).completions.create(model="run", prompt=text, max_tokens=0, echo=True, logprobs=1)
    lp = r.choices[0].logprobs
    want = lm.logprobs(text)
    assert "".join(lp.tokens) == text and r.choices[0].text == text
    assert lp.token_logprobs == pytest.approx(want.tolist(), abs=1e-5) and all(x < 0 for x in lp.token_logprobs)


def test_top_logprobs_are_the_likeliest_tokens_as_zoo_eval_scores_them(server, lm):
    """logprobs=k gives, per position, the k likeliest tokens and the chosen one (OpenAI's legacy shape, which
    lm-evaluation-harness reads to tell a greedy continuation); an alternative's number is zoo-eval's for the text
    ending in it there."""
    text = "The for statement"
    r = client(server[0]).completions.create(model="run", prompt=text, max_tokens=1, temperature=0, echo=True,
                                             logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.top_logprobs) == len(lp.tokens) == len(text) + 1 and "".join(lp.tokens) == r.choices[0].text
    for token, own, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert top[token] == own and len(top) in (3, 4) and max(top.values()) >= own
    probes = [(j, alt) for j in (4, len(text)) for alt in list(lp.top_logprobs[j])[:3] if alt.isascii()]
    want = lm.logprobs([r.choices[0].text[:j] + alt for j, alt in probes])
    assert [lp.top_logprobs[j][alt] for j, alt in probes] == pytest.approx([float(w[-1]) for w in want], abs=1e-5)
    assert len(probes) >= 4


def test_many_prompts_are_scored_a_batch_at_a_time(server, lm):
    """Scoring is cut into batches of at most a prefill's tokens (the context, 32 here), each one engine job
    between decode chunks: 4 prompts padded to 8 tokens share one, 4 of 32 take one each; results in order."""
    url = server[0]
    texts = ["Hi a", "The for statement", "Ok b", "The while loop runs", "No c", "Yes d", "The with block ends",
             "The try clause 4 a"]  # 4 to 5 tokens, and 17 to 19
    before = health(url)["scored"]
    r = client(url).completions.create(model="run", prompt=texts, max_tokens=0, echo=True, logprobs=1)
    assert health(url)["scored"] - before == 5
    for text, choice, want in zip(texts, r.choices, lm.logprobs(texts)):
        lp = choice.logprobs
        assert "".join(lp.tokens) == text and lp.token_logprobs == pytest.approx(want.tolist(), abs=1e-5)
        assert all(top[t] == v and len(top) in (1, 2) for t, v, top in zip(lp.tokens, lp.token_logprobs,
                                                                             lp.top_logprobs))


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
    url = server[0]
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


CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
HOSTILE = [  # (what, path, body: a dict, raw bytes or an iterator of bytes (sent chunked), status, piece, param, code)
    ("a body over --max-request-bytes", COMPLETIONS, {"prompt": "x" * MAX_BYTES}, 413, "--max-request-bytes", None,
     "request_too_large"),
    ("a chunked body over --max-request-bytes", COMPLETIONS, iter([b'{"prompt": "' + b"x" * 8192] * 3), 413,
     "--max-request-bytes", None, "request_too_large"),
    ("JSON nested 5,000 deep", COMPLETIONS, b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, "nests more than",
     None, None),
    ("more prompts than --max-prompts", COMPLETIONS, {"prompt": ["x"] * (MAX_PROMPTS + 1), "max_tokens": 1}, 413,
     "--max-prompts", "prompt", "too_many_prompts"),
    ("more sequences than --max-queue ever holds", COMPLETIONS, {"prompt": ["x"] * 8, "n": 5, "max_tokens": 1}, 400,
     "at most 32 (--max-queue)", "n", None),
    ("another model", COMPLETIONS, {"model": "gpt-4", "prompt": "x"}, 404, "does not exist", "model",
     "model_not_found"),
    ("a chat template that fails", CHAT, {"messages": [{"role": "user", "content": "boom"}]}, 400,
     "the chat template (chat_template.jinja) failed: TemplateError: no boom here", "messages", None),
    ("an unknown response_format", CHAT, {"response_format": {"type": "xml"}}, 400,
     "'type' is one of text, json_object, json_schema", "response_format", None),
    ("a schema the grammar compiler refuses", COMPLETIONS, {"prompt": "x", "response_format": {
        "type": "json_schema", "json_schema": {"name": "t", "schema": {"type": "nope"}}}}, 400,
     "the JSON schema is refused by the grammar compiler: Invalid type: nope", "response_format", None),
    ("tools for a template without them", CHAT, {"tools": [{"type": "function", "function": {"name": "f"}}]}, 400,
     "chat template renders no tool calls", "tools", None),  # tests/serve/test_tools.py: templates with tools
    ("an unknown route", "/v1/audio/speech", {"input": "x"}, 404, "Invalid URL (POST /v1/audio/speech)", None, None),
    *[(f"'{name}', not implemented", path, {**base, name: value}, 400, f"'{name}' is not implemented", name,
       "unsupported_parameter")
      for name, value, path, base in [("tools", [{"type": "function", "function": {"name": "f"}}], COMPLETIONS,
                                       {"prompt": "x"}), ("functions", [{"name": "f"}], COMPLETIONS, {"prompt": "x"}),
                                      ("logprobs", True, CHAT, {}), ("best_of", 3, COMPLETIONS, {"prompt": "x"}),
                                      ("suffix", " end", COMPLETIONS, {"prompt": "x"})]],
]


@pytest.mark.parametrize("what, path, body, status, piece, param, code", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_and_unimplemented_requests_are_refused_in_openais_shape(server, what, path, body, status, piece,
                                                                         param, code):
    url, _, run = server
    if path == CHAT and isinstance(body, dict) and "messages" not in body:
        body = {**body, "messages": QUESTION}
    headers = {"Authorization": f"Bearer {KEY}"}
    if isinstance(body, dict):
        r = httpx.post(url + path, json=body, headers=headers)
    else:
        r = httpx.post(url + path, content=body, headers=headers)
    error = r.json()["error"]
    assert (r.status_code, error["param"], error["code"]) == (status, param, code) and piece in error["message"]
    assert error["type"] == "invalid_request_error" and run not in r.text and "Traceback" not in r.text
    assert client(url).completions.create(model="run", prompt="ok", max_tokens=2).usage.completion_tokens == 2


def test_fields_that_ask_for_nothing_are_accepted(server):
    url, headers = server[0], {"Authorization": f"Bearer {KEY}"}
    nothing = {"tools": [], "tool_choice": "none", "response_format": {"type": "text"}, "logit_bias": {},
               "presence_penalty": 0, "frequency_penalty": 0.0, "model": "run"}
    r = httpx.post(url + CHAT, json={"messages": QUESTION, "max_tokens": 2, "logprobs": False, **nothing},
                   headers=headers)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    r = httpx.post(url + COMPLETIONS, json={"prompt": "x", "max_tokens": 2, "best_of": 1, "suffix": None, **nothing},
                   headers=headers)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def scrape(url) -> dict:
    """GET /metrics, parsed as Prometheus parses it: {(sample name, its labels as sorted pairs): value}."""
    from prometheus_client.parser import text_string_to_metric_families
    r = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain"), r.text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


def test_metrics_go_up_by_exactly_what_was_sent(server):
    """Two prompts x n=2 and a streamed chat: the requests by route and status, the prompt and generated tokens
    (the responses' usage), a first token timed per completion, a latency per request; the gauges idle after."""
    url = server[0]
    c = client(url)
    before = scrape(url)
    r = c.completions.create(model="run", prompt=["The", "Hi there"], max_tokens=5, temperature=1.0, seed=3, n=2)
    chat = [ch.usage for ch in c.chat.completions.create(model="run", messages=QUESTION, max_tokens=4, temperature=0,
                                                          stream=True) if ch.usage]
    bad = httpx.post(url + COMPLETIONS, json={"prompt": "x", "max_tokens": 0},
                     headers={"Authorization": f"Bearer {KEY}"})
    after = scrape(url)

    def up(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0) - before.get(key, 0)
    assert bad.status_code == 400 and len(chat) == 1
    assert up("zoo_requests_total", route=COMPLETIONS, status="200") == 1
    assert up("zoo_requests_total", route=CHAT, status="200") == 1
    assert up("zoo_requests_total", route=COMPLETIONS, status="400") == 1
    assert up("zoo_prompt_tokens_total") == r.usage.prompt_tokens + chat[0].prompt_tokens
    assert up("zoo_generation_tokens_total") == r.usage.completion_tokens + chat[0].completion_tokens > 0
    assert up("zoo_time_to_first_token_seconds_count") == 5 and up("zoo_e2e_request_latency_seconds_count") == 2
    finished = [up("zoo_request_success_total", finished_reason=why) for why in ("stop", "length")]
    assert sum(finished) == 5 and finished[1] >= 1  # the chat's 4 greedy tokens end at max_tokens
    assert 1 <= up("zoo_time_per_output_token_seconds_count") <= 5
    idle = {name: after[(name, ())] for name in ("zoo_num_requests_running", "zoo_num_requests_waiting",
                                                 "zoo_kv_cache_slots_in_use", "zoo_requests_in_progress")}
    assert idle == dict.fromkeys(idle, 0) and after[("zoo_kv_cache_slots", ())] == 4 * 32  # 4 rows x the context
    assert after[("zoo_kv_cache_pages_in_use", ())] == after[("zoo_kv_cache_usage_perc", ())] == 0
    assert 0 < after[("zoo_kv_cache_pages_stored", ())] <= 8  # the prompts' whole pages of 16, kept in the store


def test_every_response_carries_its_request_id(server):
    """A client's X-Request-Id comes back in the header and in the body's id (OpenAI's prefix, as vLLM); without
    one, or with one unfit for a header or a log line, the server makes one; an error carries one too."""
    url, auth = server[0], {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(url + COMPLETIONS, json={"prompt": "x", "max_tokens": 2},
                   headers={**auth, "X-Request-Id": "trace-42"})
    assert r.headers["x-request-id"] == "trace-42" and r.json()["id"] == "cmpl-trace-42"
    r = httpx.post(url + CHAT, json={"messages": QUESTION, "max_tokens": 2}, headers=auth)
    made = r.headers["x-request-id"]
    assert re.fullmatch("[0-9a-f]{32}", made) and r.json()["id"] == "chatcmpl-" + made
    ids = [made]
    for headers, status in (({**auth, "X-Request-Id": "two words"}, 200), ({"Authorization": "Bearer nope"}, 401)):
        r = httpx.post(url + COMPLETIONS, json={"prompt": "x", "max_tokens": 2}, headers=headers)
        assert r.status_code == status and re.fullmatch("[0-9a-f]{32}", r.headers["x-request-id"])
        ids.append(r.headers["x-request-id"])
    assert len(set(ids)) == 3


def test_response_format_keeps_the_answer_to_its_schema_through_openais_client(server):
    """json_schema on a chat: each answer parses and validates (a 4-step model: the grammar's mask writes it);
    json_object on a completion cut by max_tokens before the object closes: finish_reason "length", as OpenAI."""
    schema = {"enum": ["yes", "no", True]}  # the run's window leaves a rendered question 5 tokens to answer in
    r = client(server[0]).chat.completions.create(
        model="run", messages=QUESTION, max_tokens=5, temperature=0.9, n=2, seed=3,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}})
    for c in r.choices:
        assert c.finish_reason == "stop", c.message.content
        jsonschema.validate(json.loads(c.message.content), schema)
    for max_tokens in (1, 20):
        r = client(server[0]).completions.create(model="run", prompt="x", max_tokens=max_tokens,
                                                 extra_body={"response_format": {"type": "json_object"}})
        c = r.choices[0]
        if max_tokens == 1:
            assert (c.finish_reason, c.text) == ("length", "{")
        else:
            assert c.finish_reason == "stop" and isinstance(json.loads(c.text), dict), c.text


def test_a_port_in_use_is_one_error_line_before_loading(finished_gpt, capsys, monkeypatch):
    monkeypatch.setattr(zoo, "load", lambda *a, **k: pytest.fail("zoo-serve loaded the model before taking its port"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert serve_cli.main([finished_gpt, "--port", str(port)]) == 2
    assert capsys.readouterr().err == f"error: 127.0.0.1:{port} is in use (another server?); give another --port\n"


def test_a_failing_chat_template_is_one_error_line_at_start_up(finished_gpt, tmp_path, capsys, monkeypatch):
    from zoo.engine.batching import Engine
    monkeypatch.setattr(Engine, "__init__", lambda *a, **k: pytest.fail("zoo-serve went on to build its engine"))
    run = copy_run(finished_gpt, tmp_path, "{{ raise_exception('this template is broken') }}")
    assert serve_cli.main([run, "--port", str(processes.free_port())]) == 2
    err = capsys.readouterr().err
    assert err == f"error: the chat template ({run}/chat_template.jinja) failed: TemplateError: this template is " \
                  f"broken\n"


def test_a_client_gone_mid_stream_frees_its_row_and_a_flood_is_turned_away_with_429(server):
    url = server[0]
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


def test_a_decoders_server_answers_embeddings_between_decode_chunks(server):
    """/v1/embeddings on the decoder's server: its last token's hidden state, as Pretrained.embed gives it."""
    url, _, run = server
    want = zoo.load(run).embed(["Hi there", "x"])
    r = client(url).embeddings.create(model="run", input=["Hi there", "x"])
    import numpy as np
    np.testing.assert_allclose(np.asarray([d.embedding for d in r.data]), want, atol=1e-5)


def test_ctrl_c_stops_the_server_promptly(server):  # last in the file: it stops the module's server
    """Ctrl-C ends the server cleanly within its 1 s graceful shutdown, not when its clients' keep-alive connections
    close. The bound is wide (a busy 2-core host took 2.1-3.4 s for the ~1.7 s a quiet one takes): what it catches is
    a server that waits for its connections (uvicorn's default) or hangs in the engine's thread."""
    url, p, _ = server
    t = time.perf_counter()
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    assert time.perf_counter() - t < 8.0 and p.returncode == 0
    assert "Traceback" not in err, err[-2000:]
