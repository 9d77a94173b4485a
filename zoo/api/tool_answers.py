"""Pretrained.chat(messages, tools=[...]): the tools rendered by the checkpoint's chat template (as transformers'
apply_chat_template(tools=) renders them) and each answer read back as an assistant message whose tool calls are
parsed (zoo.infer.tool_calls, the format the template teaches: Hermes/Qwen's <tool_call> or Llama 3's JSON), the
Python twin of zoo-serve's `tools` (zoo.serve.tools). The message is transformers' shape, so it can be appended to
the conversation as it is:

    {"role": "assistant", "content": text or None, "tool_calls": [{"type": "function",
                                                                   "function": {"name": ..., "arguments": {...}}}]}

An answer whose calls do not all parse stays text (content, no tool_calls), as the server answers it.
"""

from __future__ import annotations

import json

from zoo.errors import ArgumentError


def tool_format(lm, tools) -> str:
    """The tool-call format of `lm`'s chat template, once `tools` is a non-empty list of OpenAI's function tools;
    ArgumentError in one line otherwise, or where the template renders no tools."""
    from zoo.data.chat import template_for
    from zoo.infer import tool_calls
    if not isinstance(tools, (list, tuple)) or not tools:
        raise ArgumentError(f"tools={json.dumps(tools, default=str)[:80]}: give a non-empty list of "
                            f"{{'type': 'function', 'function': {{'name', 'parameters'}}}} dicts")
    for i, t in enumerate(tools):
        f = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(f, dict) \
                or not isinstance(f.get("name"), str) or not f["name"] or not isinstance(f.get("parameters", {}), dict):
            raise ArgumentError(f"tools[{i}]={json.dumps(t, default=str)[:80]}: a tool is {{'type': 'function', "
                                f"'function': {{'name': a string, 'parameters': a JSON schema object}}}}")
    fmt = tool_calls.format_of(template_for(lm.config.data.tokenizer, lm.run_dir))
    if fmt is None:
        raise ArgumentError(f"{lm.source!r}'s chat template renders no tools (it writes neither <tool_call> nor "
                            f"Llama 3's \"parameters\"); chat without tools=")
    return fmt


def message(text: str, fmt: str) -> dict:
    """The assistant message of answer `text` in tool-call format `fmt` (the module's docstring)."""
    from zoo.infer import tool_calls
    content, calls = tool_calls.parse(text, fmt)
    out = {"role": "assistant", "content": content}
    if calls:
        out["tool_calls"] = [{"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                             for c in calls]
    return out
