"""Tool calls in a model's own format: which format a chat template teaches (`format_of`), a completion's calls parsed
out of its text (`parse`), and the Lark grammar (llguidance's, with JSON schemas embedded) that makes a model write
one or more calls whose arguments validate against their function's `parameters` (`grammar_text`; zoo.infer.grammar
compiles it to the per-token mask structured output uses).

Two formats, as vLLM's `hermes` and `llama3_json` parsers read them:

    hermes   Hermes 2 Pro, Qwen 2.5, Qwen 3 (a template writing `<tool_call>`): each call is
             <tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>, text may come before; several calls
             follow one another, one a line.
    llama3   Llama 3.1 / 3.2 / 3.3 (a template writing `"parameters": `): the whole answer is one call
             {"name": "f", "parameters": {...}}, perhaps after <|python_tag|>.

A completion whose calls do not parse (a call cut by max_tokens, JSON that is not an object with a name and an
object of arguments) is left whole as text: the caller sees what the model wrote, not a guess.
"""

from __future__ import annotations

import json
import re

FORMATS = ("hermes", "llama3")
PYTHON_TAG = "<|python_tag|>"
_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
# The JSON the templates write: transformers' tojson, ", " and ": " between items (what the model learnt to write).
_WRITTEN = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def format_of(template: str) -> str | None:
    """The tool-call format a chat template teaches its model (FORMATS), or None when it renders no tools."""
    if "<tool_call>" in template:
        return "hermes"
    if "tools" in template and '"parameters"' in template:
        return "llama3"
    return None


def _call(text: str, key: str) -> dict | None:
    """{"name", "arguments": dict} of one call's JSON text, or None when it is no call."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get(key, value.get("arguments", value.get("parameters")))
    return {"name": value["name"], "arguments": arguments} if isinstance(arguments, dict) else None


def parse(text: str, fmt: str) -> tuple[str | None, list[dict]]:
    """(content, calls) of a completion in format `fmt`: calls are {"name", "arguments": dict}; content is the text
    outside them (None when only whitespace). Calls that do not all parse leave (text, [])."""
    if fmt == "hermes":
        found = list(_HERMES.finditer(text))
        calls = [_call(m.group(1).strip(), "arguments") for m in found]
        if not found or None in calls:
            return text, []
        rest = text[:found[0].start()] + text[found[-1].end():]
        return (rest if rest.strip() else None), calls
    body = text.strip()
    body = body[len(PYTHON_TAG):].strip() if body.startswith(PYTHON_TAG) else body
    if not body.startswith("{"):
        return text, []
    calls = [_call(part, "parameters") for part in _split(body)]
    return (None, calls) if calls and None not in calls else (text, [])


def _split(body: str) -> list[str]:
    """One JSON text, or several joined by ';' (Llama 3.2's parallel calls, as vLLM reads them)."""
    try:
        json.loads(body)
        return [body]
    except ValueError:
        return [p.strip() for p in body.split(";")]


def holds_call(text: str, fmt: str) -> int:
    """Where the text that may become a call starts (a stream holds it back until the end), or len(text): hermes'
    `<tool_call>` or the part of it the text ends with; llama3's whole answer once it starts as a call may."""
    if fmt == "hermes":
        at = text.find("<tool_call>")
        if at >= 0:
            return at
        for k in range(len("<tool_call>") - 1, 0, -1):
            if text.endswith("<tool_call>"[:k]):
                return len(text) - k
        return len(text)
    head = text.lstrip()
    if not head or head.startswith(("{", PYTHON_TAG)) or PYTHON_TAG.startswith(head):
        return 0
    return len(text)


def grammar_text(fmt: str, functions: list[dict], parallel: bool) -> str:
    """The Lark grammar of an answer that is only calls of `functions` (OpenAI's function objects: name, parameters):
    one, or with `parallel` (hermes only: Llama's templates take one call a turn) one or more."""
    key = "arguments" if fmt == "hermes" else "parameters"
    none = {"type": "object", "properties": {}, "additionalProperties": False}  # OpenAI: no parameters, no arguments
    alternatives = []
    for f in functions:
        schema = {"type": "object", "properties": {"name": {"const": f["name"]}, key: f.get("parameters") or none},
                  "required": ["name", key], "additionalProperties": False, "x-guidance": _WRITTEN}
        alternatives.append("%json " + json.dumps(schema))
    body = "\n    | ".join(alternatives)
    if fmt == "hermes":
        start = 'start: call ("\\n" call)*' if parallel else "start: call"
        return f'{start}\ncall: "<tool_call>\\n" object "\\n</tool_call>"\nobject: {body}\n'
    return f"start: {body}\n"
