"""zoo-serve's tool calls: a chat request's `tools`, `tool_choice` and `parallel_tool_calls` checked (the legacy
`functions` and `function_call` mapped onto them), its conversation made ready for the chat template (assistant
`tool_calls` and `role: "tool"` results, as transformers' templates read them), and each completion's text turned
into OpenAI's message (`tool_calls`, finish_reason "tool_calls"), whole or as a stream's deltas.

The checkpoint's template renders the tools (transformers' `tools=` convention: the tool objects as sent) and
chooses the format the calls are read in (zoo.infer.tool_calls: hermes or llama3). tool_choice:

    auto       the model decodes freely; calls in its text are parsed (text that does not parse stays content)
    none       the tools are still rendered (as OpenAI does) but nothing is parsed: the answer is text
    required   the grammar (zoo.infer.grammar's mask) lets the model write only calls of the tools, their arguments
               valid against each function's `parameters`: one, or several with parallel_tool_calls (hermes)
    {"type": "function", "function": {"name": F}}   the grammar of one call of F
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid

from zoo.infer import tool_calls
from zoo.serve.request_checks import ApiError, _field

CHOICES = ("none", "auto", "required")
ROLES = ("system", "user", "assistant", "tool")
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function's name


@dataclasses.dataclass(frozen=True)
class Tools:
    """A request's tools: `tools` as sent (the template's `tools`), `choice` none / auto / required or the one
    function's name, `parallel` (more than one call allowed), `fmt` the template's format (None: it has none)."""
    tools: list
    choice: str
    parallel: bool
    fmt: str | None

    def grammar(self) -> str | None:
        """The Lark grammar the answer must follow (required or a named function), else None."""
        if self.choice in ("none", "auto"):
            return None
        functions = [t["function"] for t in self.tools]
        if self.choice != "required":
            functions = [f for f in functions if f["name"] == self.choice]
        return tool_calls.grammar_text(self.fmt, functions, self.parallel and self.choice == "required")


def template_format(lm) -> str | None:
    """The tool-call format of the chat template `lm`'s chats render with (zoo.infer.tool_calls), or None."""
    from zoo.data.chat import template_for
    return tool_calls.format_of(template_for(lm.config.data.tokenizer, lm.run_dir))


def _bad(message: str, param: str) -> ApiError:
    return ApiError(400, message, param=param)


def _show(value) -> str:
    return json.dumps(value)[:80]


def _legacy(body: dict) -> tuple[object, object, str, str]:
    """(tools, tool_choice, and the names they were sent as): the legacy functions / function_call as tools."""
    if body.get("functions") not in (None, []):
        if body.get("tools") not in (None, []):
            raise _bad("give 'tools' or the legacy 'functions', not both", "functions")
        functions = body["functions"]
        if not isinstance(functions, list):
            raise _bad(f"'functions' must be a list of function objects; got {_show(functions)}", "functions")
        tools = [{"type": "function", "function": f} for f in functions]
        call = body.get("function_call")
        choice = {"type": "function", "function": call} if isinstance(call, dict) else call
        return tools, choice, "functions", "function_call"
    return body.get("tools"), body.get("tool_choice"), "tools", "tool_choice"


def _check_tool(tool, i: int, where: str) -> str:
    """The function's name of tools[i], checked: a function object whose parameters are a JSON schema."""
    from zoo.infer.grammar import schema_problem
    at = f"{where}[{i}]" + (".function" if where == "tools" else "")
    if where == "tools":
        f = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        shape = '{"type": "function", "function": {"name", "description", "parameters"}}'
    else:
        f, shape = tool["function"], '{"name", "description", "parameters"}'
    if not isinstance(f, dict):
        raise _bad(f"'{where}[{i}]' must be {shape}; got {_show(tool if where == 'tools' else f)}", where)
    name = f.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise _bad(f"'{at}.name' must be 1 to 64 letters, digits, '_' or '-'; got {_show(name)}", where)
    if not isinstance(f.get("description", ""), str):
        raise _bad(f"'{at}.description' must be a string; got {_show(f['description'])}", where)
    if "parameters" in f:
        problem = schema_problem(f["parameters"]) if isinstance(f["parameters"], dict) else "not an object"
        if problem:
            raise _bad(f"'{at}.parameters' of '{name}' is not a JSON schema ({problem}); give an object schema such "
                       f"as {{\"type\": \"object\", \"properties\": {{...}}}}", where)
    return name


def of(body: dict, fmt: str | None) -> Tools | None:
    """The request's tools checked, or None (none sent); `fmt` is the chat template's tool-call format. Bad ones are
    400s naming the field and the valid choices."""
    tools, choice, where, choosing = _legacy(body)
    if tools in (None, []):
        if choice not in (None, "none"):
            raise _bad(f"'{choosing}' needs '{where}': there is no function to call; send tools or leave it out",
                       choosing)
        return None
    if not isinstance(tools, list):
        raise _bad(f"'{where}' must be a list of tools; got {_show(tools)}", where)
    names = [_check_tool(t, i, where) for i, t in enumerate(tools)]
    if len(set(names)) < len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise _bad(f"'{where}' names the function '{twice}' twice; each function's name must be its own", where)
    if choice is None:
        choice = "auto"
    elif isinstance(choice, dict):
        f = choice.get("function") if choice.get("type") == "function" else None
        name = f.get("name") if isinstance(f, dict) else None
        if not isinstance(name, str):
            raise _bad(f"'{choosing}' must be one of {', '.join(CHOICES)} or {{\"type\": \"function\", \"function\": "
                       f"{{\"name\": ...}}}}; got {_show(choice)}", choosing)
        if name not in names:
            raise _bad(f"'{choosing}' names the function {_show(name)}, which is not among the tools; choose one of "
                       f"{', '.join(names)}", choosing)
        choice = name
    elif choice not in CHOICES:
        raise _bad(f"'{choosing}' must be one of {', '.join(CHOICES)} or {{\"type\": \"function\", \"function\": "
                   f"{{\"name\": ...}}}}; got {_show(choice)}", choosing)
    if fmt is None and choice != "none":
        raise _bad(f"this model's chat template renders no tool calls (it writes neither <tool_call> nor Llama 3's "
                   f"\"parameters\" JSON), so none could be read back; send {choosing} \"none\" or serve a checkpoint "
                   f"whose template has tools", where)
    parallel = _field(body, "parallel_tool_calls", bool, True, what="true or false")
    return Tools(tools, choice, parallel, fmt)


def mentions_tools(messages: list) -> bool:
    """Whether a conversation holds tool calls or their results (it then needs `conversation`'s rendering)."""
    return any(isinstance(m, dict) and (m.get("role") in ("tool", "function") or m.get("tool_calls")
                                        or m.get("function_call")) for m in messages)


def _arguments(call, i: int, j: int) -> dict:
    """One assistant tool call as templates read it: {"type", "function": {"name", "arguments": a dict}}."""
    where = f"messages[{i}].tool_calls[{j}]"
    f = call.get("function") if isinstance(call, dict) else None
    if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not isinstance(f.get("arguments"), str):
        raise _bad(f"'{where}' must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\": str, "
                   f"\"arguments\": a JSON text}}}}; got {_show(call)}", "messages")
    try:
        arguments = json.loads(f["arguments"])
    except ValueError:
        raise _bad(f"'{where}.function.arguments' is not JSON: {f['arguments'][:80]!r}", "messages") from None
    return {**call, "type": "function", "function": {"name": f["name"], "arguments": arguments}}


def conversation(messages: list) -> list[dict]:
    """The messages as a chat template reads them: each assistant tool call's arguments a dict (OpenAI sends a JSON
    text), a legacy function_call as a tool call and a `function` result as a `tool` one; a malformed one a 400."""
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in (*ROLES, "function"):
            raise _bad(f"messages[{i}] has role {_show(m.get('role') if isinstance(m, dict) else m)}; choose one of "
                       f"{', '.join(ROLES)}", "messages")
        m = {**m, "role": "tool"} if m["role"] == "function" else dict(m)
        if m["role"] == "assistant" and m.get("function_call"):
            m["tool_calls"] = [{"type": "function", "function": m.pop("function_call")}]
        calls = m.get("tool_calls") if m["role"] == "assistant" else None
        if calls is not None:
            if not isinstance(calls, list):
                raise _bad(f"'messages[{i}].tool_calls' must be a list; got {_show(calls)}", "messages")
            m["tool_calls"] = [_arguments(c, i, j) for j, c in enumerate(calls)]
        if not isinstance(m.get("content"), str) and not (calls and m.get("content") is None):
            raise _bad(f"messages[{i}] has content {_show(m.get('content'))}; 'content' must be a string (null only "
                       f"beside an assistant's tool_calls)", "messages")
        out.append(m)
    return out


def _calls(calls: list[dict]) -> list[dict]:
    return [{"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)}}
            for c in calls]


def message(text: str, finish: str, t: Tools | None) -> tuple[dict, str]:
    """(OpenAI's message, finish_reason) of a finished completion's text."""
    if t is None or t.choice == "none":
        return {"role": "assistant", "content": text}, finish
    content, calls = tool_calls.parse(text, t.fmt)
    if not calls:
        return {"role": "assistant", "content": text}, finish
    return {"role": "assistant", "content": content, "tool_calls": _calls(calls)}, "tool_calls"


class Deltas:
    """One streamed choice's deltas: its text sent as it comes until a tool call may begin there, then held to the
    end and parsed: the content not sent yet, then a delta per call, whole (id, name and arguments at once, which
    the openai client's accumulation reads as it reads OpenAI's fragments)."""

    def __init__(self, t: Tools | None):
        self.t, self.text, self.sent, self.called = t if t is not None and t.choice != "none" else None, "", 0, False

    def feed(self, piece: str, finished: bool) -> list[dict]:
        self.text += piece
        if self.t is None:
            return [{"content": piece}] if piece else []
        if not finished:
            end = max(self.sent, tool_calls.holds_call(self.text, self.t.fmt))
            out, self.sent = self.text[self.sent:end], end
            return [{"content": out}] if out else []
        if self.sent > len(self.text):  # already finished
            return []
        content, calls = tool_calls.parse(self.text, self.t.fmt)
        rest = (content or "")[self.sent:] if calls else self.text[self.sent:]
        self.sent, self.called = len(self.text) + 1, bool(calls)
        return ([{"content": rest}] if rest else []) + [{"tool_calls": [{"index": k, **c}]}
                                                       for k, c in enumerate(_calls(calls))]

    def finish(self, reason: str) -> str:
        return "tool_calls" if self.called else reason
