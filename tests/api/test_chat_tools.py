"""Pretrained.chat(messages, tools=[...]) (zoo.api.tool_answers): the tools reach the prompt as the chat template
renders them, an answer in the template's format comes back as an assistant message with parsed tool calls (one
that does not parse stays text), the real decode path answers a message too, and bad tools or a template without
tools are refused in one line."""

import dataclasses

import pytest

import zoo
from tests.helpers.tool_templates import HERMES, LLAMA3
from zoo.api import decoder
from zoo.data import chat
from zoo.errors import ArgumentError

TOOLS = [{"type": "function", "function": {"name": "weather", "description": "A city's forecast", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def base():
    return zoo.load("llama_tiny")  # random weights, byte tokens


def with_template(lm, tmp_path, template: str | None):
    if template is not None:
        (tmp_path / chat.TEMPLATE_FILE).write_text(template)
    return dataclasses.replace(lm, run_dir=str(tmp_path) if template is not None else None)


@pytest.mark.parametrize("template, answer, want", [
    (HERMES, 'Sure.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     {"role": "assistant", "content": "Sure.\n",
      "tool_calls": [{"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}]}),
    (LLAMA3, '{"name": "weather", "parameters": {"city": "Oslo"}}',
     {"role": "assistant", "content": None,
      "tool_calls": [{"type": "function", "function": {"name": "weather", "arguments": {"city": "Oslo"}}}]}),
    (HERMES, '<tool_call>\n{"name": "weather", "arguments": "Paris"}</tool_call>',  # no arguments object: text
     {"role": "assistant", "content": '<tool_call>\n{"name": "weather", "arguments": "Paris"}</tool_call>'}),
])
def test_chat_with_tools_renders_them_and_parses_the_answer_s_calls(base, tmp_path, monkeypatch, template, answer,
                                                                    want):
    lm = with_template(base, tmp_path, template)
    seen = []

    def decode(lm_, prompts, **kw):  # the model's answer, as if decoded
        seen.extend(prompts)
        return [lm.tokenizer.encode(answer)]
    monkeypatch.setattr(decoder, "generate_ids", decode)
    assert lm.chat(ASK, tools=TOOLS) == want
    prompt = lm.tokenizer.decode(seen[0])
    assert '"name": "weather"' in prompt and "Weather in Paris?" in prompt  # the tools, rendered by the template
    monkeypatch.undo()


def test_chat_with_tools_decodes_an_assistant_message(base, tmp_path):
    got = with_template(base, tmp_path, HERMES).chat(ASK, tools=TOOLS, max_new_tokens=4)
    assert got["role"] == "assistant" and isinstance(got["content"], str) and got["content"]


@pytest.mark.parametrize("template, tools, words", [
    (None, TOOLS, "chat template renders no tools"),
    (HERMES, [], "give a non-empty list"),
    (HERMES, [{"type": "function", "function": {"parameters": {}}}], "tools[0]="),
])
def test_bad_tools_or_a_template_without_tools_are_one_line(base, tmp_path, template, tools, words):
    with pytest.raises(ArgumentError, match=r"^[^\n]*" + words.replace("[", r"\[")):
        with_template(base, tmp_path, template).chat(ASK, tools=tools)
