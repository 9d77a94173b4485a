"""zoo-serve's tool calls (zoo.serve.tools, zoo.infer.tool_calls): completions in the Hermes/Qwen and Llama 3 formats
parse into calls, malformed ones stay text, and a stream's deltas join into the whole answer; a conversation with
tools, calls and results renders as transformers renders it; bad tools and tool_choices are one line in OpenAI's
shape; and through the openai client on a tiny model of random weights (llama_tiny, its window widened to 1024,
in-process behind starlette's TestClient) with a copy of each format's template, tool_choice "required" and a
named function write calls whose arguments validate (the grammar's mask leaves nothing else), streamed as they
are answered whole, and the tool loop's second turn renders the call and its result."""

import dataclasses
import json

import jsonschema
import openai
import pytest
from starlette.testclient import TestClient
from transformers.utils.chat_template_utils import render_jinja_template

import zoo
from tests.helpers.tool_templates import HERMES, LLAMA3
from zoo.data import chat
from zoo.infer import tool_calls
from zoo.serve import tools

WEATHER = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "weather", "description": "A city's forecast",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "now", "description": "The time"}}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
CALL = '{"name": "weather", "arguments": {"city": "Paris", "days": 2}}'
PARIS = {"name": "weather", "arguments": {"city": "Paris", "days": 2}}

HERMES_CASES = [  # (completion, content, calls)
    (f"<tool_call>\n{CALL}\n</tool_call>", None, [PARIS]),
    (f"Let me look.\n<tool_call>\n{CALL}\n</tool_call>\n<tool_call>\n{{\"name\": \"now\", \"arguments\": {{}}}}\n"
     f"</tool_call>", "Let me look.\n", [PARIS, {"name": "now", "arguments": {}}]),
    (f"<tool_call>\n{CALL}", None, [PARIS]),  # the end-of-text before </tool_call>: the JSON is whole
    (f"<tool_call>\n{CALL[:-5]}", f"<tool_call>\n{CALL[:-5]}", []),  # cut by max_tokens: text
    ('<tool_call>\n{"name": "weather", "arguments": "Paris"}\n</tool_call>',
     '<tool_call>\n{"name": "weather", "arguments": "Paris"}\n</tool_call>', []),  # arguments no object
    ('<tool_call>\n{"arguments": {}}\n</tool_call>', '<tool_call>\n{"arguments": {}}\n</tool_call>', []),
    ("It is sunny.", "It is sunny.", []),
    (f"<tool_call>\n{CALL}\n</tool_call><tool_call>\nnot json</tool_call>",
     f"<tool_call>\n{CALL}\n</tool_call><tool_call>\nnot json</tool_call>", []),  # one bad call: all text
]
LLAMA_CASES = [
    ('{"name": "weather", "parameters": {"city": "Paris", "days": 2}}', None, [PARIS]),
    ('<|python_tag|>{"name": "weather", "parameters": {"city": "Paris", "days": 2}}', None, [PARIS]),
    ('{"name": "weather", "parameters": {"city": "Paris", "days": 2}}; {"name": "now", "parameters": {}}', None,
     [PARIS, {"name": "now", "arguments": {}}]),
    ('{"name": "weather", "parameters": {"city": "Par', '{"name": "weather", "parameters": {"city": "Par', []),
    ('{"city": "Paris"}', '{"city": "Paris"}', []),  # JSON, but no call
    ("The weather is fine.", "The weather is fine.", []),
]


@pytest.mark.parametrize("fmt, text, content, calls", [("hermes", *c) for c in HERMES_CASES]
                         + [("llama3", *c) for c in LLAMA_CASES])
def test_completions_parse_into_calls_and_malformed_ones_stay_text(fmt, text, content, calls):
    assert tool_calls.parse(text, fmt) == (content, calls)
    t = tools.Tools(TOOLS, "auto", True, fmt)
    message, finish = tools.message(text, "stop", t)
    assert finish == ("tool_calls" if calls else "stop") and message["content"] == content
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls", [])]
    assert got == [(c["name"], c["arguments"]) for c in calls]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in message.get("tool_calls", []))
    # Streamed a character at a time: the deltas join into the same content and calls.
    d = tools.Deltas(t)
    deltas = [x for i, ch in enumerate(text) for x in d.feed(ch, i == len(text) - 1)]
    joined = "".join(x.get("content", "") for x in deltas)
    assert joined == (content or "") and d.finish("stop") == finish
    streamed = [x["tool_calls"][0] for x in deltas if "tool_calls" in x]
    assert [(c["index"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in streamed] == \
        [(k, c["name"], c["arguments"]) for k, c in enumerate(calls)]
    assert tools.message(text, "stop", tools.Tools(TOOLS, "none", True, fmt)) == (
        {"role": "assistant", "content": text}, "stop")  # tool_choice none: nothing parsed


def test_a_stream_sends_the_text_before_a_call_at_once_and_holds_the_call():
    d = tools.Deltas(tools.Tools(TOOLS, "auto", True, "hermes"))
    assert d.feed("Let me look. <tool", False) == [{"content": "Let me look. "}]  # "<tool" may begin a call
    assert d.feed("_call>\n{", False) == [] and d.feed("<x", False) == []
    d = tools.Deltas(tools.Tools(TOOLS, "auto", True, "hermes"))
    assert d.feed("a <tool", False) == [{"content": "a "}] and d.feed("box>", False) == [{"content": "<toolbox>"}]
    d = tools.Deltas(tools.Tools(TOOLS, "auto", True, "llama3"))
    assert d.feed(" <|python", False) == [] and d.feed("_tag|>{", False) == []
    d = tools.Deltas(tools.Tools(TOOLS, "auto", True, "llama3"))
    assert d.feed("Hello", False) == [{"content": "Hello"}]


def test_the_format_is_chosen_by_the_template():
    assert [tool_calls.format_of(t) for t in (HERMES, LLAMA3, chat.DEFAULT_TEMPLATE)] == ["hermes", "llama3", None]


def accepts(g, text: str) -> bool:
    """Whether grammar `g` takes `text` whole (byte tokens) and may end there."""
    from zoo.data.tokenizers import get_tokenizer
    m = g.matcher()
    for t in get_tokenizer("bytes").encode(text):
        if not m.m.consume_token(t):
            return False
    return m.m.is_accepting()


def test_the_grammar_of_required_calls_takes_valid_calls_only():
    from zoo.data.tokenizers import get_tokenizer
    from zoo.infer import grammar
    tok = get_tokenizer("bytes")
    compiled = {(fmt, choice, parallel): grammar.compile_lark(tok, (tok.eot_token,), tools.Tools(
        TOOLS, choice, parallel, fmt).grammar()) for fmt, choice, parallel in [
        ("hermes", "required", True), ("hermes", "required", False), ("hermes", "weather", True),
        ("llama3", "required", True)]}
    now = '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'
    two = f"<tool_call>\n{CALL}\n</tool_call>\n{now}"
    assert accepts(compiled["hermes", "required", True], two) and accepts(compiled["hermes", "required", True], now)
    assert not accepts(compiled["hermes", "required", False], two)  # parallel_tool_calls false: one call
    assert not accepts(compiled["hermes", "weather", True], now)  # the named function only
    assert not accepts(compiled["hermes", "required", True], f"<tool_call>\n{CALL[:-3]}9}}}}\n</tool_call>")  # days 9
    assert not accepts(compiled["hermes", "required", True], "Sure.")
    llama = '{"name": "weather", "parameters": {"city": "Oslo", "days": 7}}'
    assert accepts(compiled["llama3", "required", True], llama)
    assert not accepts(compiled["llama3", "required", True], '{"name": "weather", "arguments": {}}')


def test_legacy_functions_and_function_call_map_onto_tools():
    f = TOOLS[0]["function"]
    assert tools.of({"functions": [f], "function_call": {"name": "weather"}}, "hermes") == tools.Tools(
        [{"type": "function", "function": f}], "weather", True, "hermes")
    assert tools.of({"functions": [f], "function_call": "none", "parallel_tool_calls": False}, None) == tools.Tools(
        [{"type": "function", "function": f}], "none", False, None)
    assert tools.of({"tools": TOOLS}, "llama3").choice == "auto" and tools.of({"tools": [], "tool_choice": "none"},
                                                                              "hermes") is None
    legacy = tools.conversation(ASK + [{"role": "assistant", "content": None, "function_call": {
        "name": "weather", "arguments": '{"city": "Paris", "days": 2}'}}, {"role": "function", "name": "weather",
                                                                           "content": "sunny"}])
    assert legacy[1]["tool_calls"] == [{"type": "function", "function": PARIS}] and legacy[2]["role"] == "tool"


def loop_conversation() -> tuple[list[dict], list[dict]]:
    """A tool loop as OpenAI's client sends it (arguments a JSON text) and as transformers' templates take it
    (arguments a dict)."""
    call = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": json.dumps(
        PARIS["arguments"])}}
    sent = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    theirs = ASK + [{"role": "assistant", "tool_calls": [{"type": "function", "function": PARIS}]},
                    {"role": "tool", "content": "sunny"}]
    return sent, theirs


@pytest.mark.parametrize("template", [HERMES, LLAMA3], ids=["hermes", "llama3"])
def test_tools_calls_and_results_render_as_transformers_renders_them(template):
    sent, theirs = loop_conversation()
    ours = chat.render(template, tools.conversation(sent), add_generation_prompt=True,
                       variables={"bos_token": "<s>", "eos_token": "</s>", "tools": TOOLS})
    want = render_jinja_template([theirs], tools=TOOLS, chat_template=template, add_generation_prompt=True,
                                 bos_token="<s>", eos_token="</s>")[0][0]
    assert ours == want and json.dumps(WEATHER) in ours and '"city": "Paris", "days": 2' in ours and "sunny" in ours


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """llama_tiny (random weights, byte tokens) with a 1024-token window (its rotary positions reach any), 2 slots,
    one prefill program (no prefix cache, prompts in one piece)."""
    from zoo import tasks
    from zoo.api.pretrained import Pretrained
    from zoo.engine.batching import Engine
    base = zoo.load("llama_tiny")
    cfg = dataclasses.replace(base.config, model=dataclasses.replace(base.config.model, max_len=1024),
                              context_len=1024)
    lm = Pretrained(tasks.build(cfg).model, base.params, base.tokenizer, cfg, source="llama_tiny", kind="preset")
    e = Engine(lm, slots=2, max_len=1024, chunk=4, prefix_cache=False, prefill_chunk=1024)
    e.start()
    yield e
    e.stop()


def serving(engine, tmp_path, template: str | None):
    """An openai client of a zoo-serve app over `engine`, its model's chat template `template` (None: zoo's
    default, which has no tools); (the client, its HTTP client)."""
    from zoo.serve.app import create_app
    if template is not None:
        (tmp_path / chat.TEMPLATE_FILE).write_text(template)
    engine.lm.run_dir = str(tmp_path)  # the app reads its template's format once, its template at each request
    http = TestClient(create_app(engine, model_id="tiny"))
    return openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http, max_retries=0), http


def called(message) -> list[tuple[str, dict]]:
    """(name, arguments) of each call of an answer, each validated against its function's parameters."""
    out = []
    for c in message.tool_calls:
        arguments = json.loads(c.function.arguments)
        jsonschema.validate(arguments, WEATHER if c.function.name == "weather" else {"additionalProperties": False})
        out.append((c.function.name, arguments))
    return out


def test_hermes_required_and_named_calls_and_the_tool_loop_through_the_openai_client(engine, tmp_path):
    c, _ = serving(engine, tmp_path, HERMES)
    r = c.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=120,
                                  temperature=0, parallel_tool_calls=False)
    got = called(r.choices[0].message)
    assert r.choices[0].finish_reason == "tool_calls" and len(got) == 1 and r.choices[0].message.content is None
    with c.chat.completions.stream(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=120,
                                   temperature=0, parallel_tool_calls=False) as s:  # the client accumulates deltas
        streamed = s.get_final_completion().choices[0]
    assert called(streamed.message) == got and streamed.finish_reason == "tool_calls"
    named = c.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, max_tokens=120, temperature=1,
                                      seed=5, tool_choice={"type": "function", "function": {"name": "weather"}})
    assert [n for n, _ in called(named.choices[0].message)] == ["weather"]
    # The loop: the call and its result sent back; the second answer's prompt is what transformers renders.
    sent, theirs = loop_conversation()
    call = named.choices[0].message.model_dump(exclude_none=True)
    sent = ASK + [call, {"role": "tool", "tool_call_id": call["tool_calls"][0]["id"], "content": "sunny"}]
    theirs = ASK + [{"role": "assistant", "tool_calls": [{"type": "function", "function": {
        "name": "weather", "arguments": json.loads(call["tool_calls"][0]["function"]["arguments"])}}]}, theirs[-1]]
    second = c.chat.completions.create(model="tiny", messages=sent, tools=TOOLS, max_tokens=3, temperature=0)
    want = render_jinja_template([theirs], tools=TOOLS, chat_template=HERMES, add_generation_prompt=True,
                                 bos_token="", eos_token=engine.lm.tokenizer.eot_text)[0][0]
    assert second.usage.prompt_tokens == len(engine.lm.tokenizer.encode_with_offsets(want)[0])
    assert second.choices[0].message.tool_calls is None and isinstance(second.choices[0].message.content, str)


def test_llama3_required_call_streams_as_it_answers_whole(engine, tmp_path):
    c, _ = serving(engine, tmp_path, LLAMA3)
    ask = dict(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=120, temperature=0)
    whole = c.chat.completions.create(**ask)
    chunks = list(c.chat.completions.create(**ask, stream=True))
    deltas = [d for ch in chunks if ch.choices for d in ch.choices[0].delta.tool_calls or []]
    assert [(d.index, d.function.name, d.function.arguments) for d in deltas] == [
        (0, t.function.name, t.function.arguments) for t in whole.choices[0].message.tool_calls]
    assert len(called(whole.choices[0].message)) == 1 and chunks[-1].choices[0].finish_reason == "tool_calls"
    assert deltas[0].id.startswith("call_") and whole.choices[0].finish_reason == "tool_calls"


BAD = [  # (what, the request's fields beside messages, param, a piece of the message)
    ("parameters that are no JSON schema", {"tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "nope"}}}]}, "tools", "'tools[0].function.parameters' of 'f' is not a "
                                                                  "JSON schema (Invalid type: nope)"),
    ("parameters that are no object", {"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]},
     "tools", "is not a JSON schema (not an object)"),
    ("a tool_choice naming an absent function", {"tools": TOOLS, "tool_choice": {
        "type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "names the function \"nope\", which is not among the tools; choose one of weather, now"),
    ("an unknown tool_choice", {"tools": TOOLS, "tool_choice": "any"}, "tool_choice",
     "'tool_choice' must be one of none, auto, required or"),
    ("a tool_choice without tools", {"tool_choice": "required"}, "tool_choice", "'tool_choice' needs 'tools'"),
    ("a tool of another type", {"tools": [{"type": "retrieval"}]}, "tools", "'tools[0]' must be {\"type\": "),
    ("a function named twice", {"tools": [TOOLS[1], TOOLS[1]]}, "tools", "names the function 'now' twice"),
    ("a bad function name", {"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools",
     "'tools[0].function.name' must be 1 to 64 letters"),
    ("legacy functions naming an absent one", {"functions": [TOOLS[1]["function"]], "function_call": {"name": "x"}},
     "function_call", "names the function \"x\", which is not among the tools; choose one of now"),
    ("tools and functions", {"tools": TOOLS, "functions": [TOOLS[1]["function"]]}, "functions", "not both"),
    ("a call whose arguments are no JSON", {"messages": ASK + [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "now", "arguments": "{x"}}]}]}, "messages",
     "'messages[1].tool_calls[0].function.arguments' is not JSON"),
    ("a message of an unknown role", {"tools": TOOLS, "messages": [{"role": "robot", "content": "x"}]}, "messages",
     "choose one of system, user, assistant, tool"),
    ("a required call beside response_format", {"tools": TOOLS, "tool_choice": "required",
                                                "response_format": {"type": "json_object"}}, "response_format",
     "send one of them"),
    ("parallel_tool_calls not a bool", {"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls",
     "'parallel_tool_calls' must be true or false"),
]


def test_bad_tool_requests_are_one_line_in_openais_shape(engine, tmp_path):
    (tmp_path / "hermes").mkdir()
    _, http = serving(engine, tmp_path / "hermes", HERMES)
    for what, fields, param, piece in BAD:
        r = http.post("/v1/chat/completions", json={"messages": ASK, **fields})
        error = r.json()["error"]
        assert (r.status_code, error["param"], error["type"]) == (400, param, "invalid_request_error"), what
        assert piece in error["message"] and "\n" not in error["message"], (what, error["message"])
    (tmp_path / "plain").mkdir()
    _, http = serving(engine, tmp_path / "plain", None)  # zoo's default template: no tools
    r = http.post("/v1/chat/completions", json={"messages": ASK, "tools": TOOLS})
    assert r.status_code == 400 and "chat template renders no tool calls" in r.json()["error"]["message"]
    long = [{"role": "user", "content": "Weather? " * 70}]  # in the prefill program the other tests compiled
    r = http.post("/v1/chat/completions", json={"messages": long, "tools": TOOLS, "tool_choice": "none",
                                                "max_tokens": 2})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None
