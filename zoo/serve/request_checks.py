"""What zoo-serve's handlers (zoo.serve.app) check in a request before the engine sees it: OpenAI's error shape
(`ApiError`), a body's JSON within its nesting limit, each field's type and range (`_field`, `sampling`), the
fields zoo does not implement refused by name (NOT_IMPLEMENTED), and messages cut of the server's file paths."""

from __future__ import annotations

import json
import re


MAX_N = 8  # completions a request may ask for
INLINE = 64 << 10  # bytes of body or prompt text handled on the event loop; more go to a worker thread
MAX_DEPTH = 32  # how deeply a request's JSON may nest (OpenAI's own requests nest a few levels)
# OpenAI's fields that zoo does not implement, each with the values that ask for nothing (some clients send them as
# defaults); any other value is refused, naming the field, rather than silently ignored.
NOT_IMPLEMENTED = {"logit_bias": (None, {}), "presence_penalty": (None, 0), "frequency_penalty": (None, 0)}
CHAT_NOT_IMPLEMENTED = {**NOT_IMPLEMENTED, "logprobs": (None, False), "top_logprobs": (None, 0)}
COMPLETION_NOT_IMPLEMENTED = {**NOT_IMPLEMENTED, "suffix": (None, ""), "tools": (None, []), "tool_choice": (None, "none"),
                              "functions": (None, []), "function_call": (None, "none")}  # a chat's (zoo.serve.tools)
_PATH = re.compile(r"(?<![\w.~])/(?:[^\s/'\"()]+/)+([^\s/'\"()]+)")  # an absolute path; group 1 its last part


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def _field(body: dict, name: str, kinds, default=None, check=None, what: str = ""):
    """body[name] checked: of one of `kinds` (bool is no number), and check(value) true; else a 400 naming it."""
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise ApiError(400, f"'{name}' must be {what}; got {json.dumps(value)}", param=name)
    if not isinstance(value, kinds) or (check is not None and not check(value)):
        raise ApiError(400, f"'{name}' must be {what}; got {json.dumps(value)[:80]}", param=name)
    return value


def sampling(body: dict, default_max: int | None) -> dict:
    """The settings every completion request shares, checked."""
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop
    if stops is not None and (not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops)
                              or len(stops) > 4):
        raise ApiError(400, "'stop' must be a string or a list of at most 4 non-empty strings", param="stop")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    return {
        "max_tokens": _field({"max_tokens": max_tokens}, "max_tokens", int, default_max, what="a whole number of tokens"),
        "temperature": float(_field(body, "temperature", (int, float), 1.0, lambda v: 0 <= v <= 2,
                                    "a number between 0 and 2")),
        "top_p": float(_field(body, "top_p", (int, float), 1.0, lambda v: 0 < v <= 1, "a number in (0, 1]")),
        "top_k": _field(body, "top_k", int, 0, lambda v: v >= 0, "a whole number >= 0 (0: off)"),
        "seed": _field(body, "seed", int, 0, lambda v: 0 <= v < 2 ** 31, "a whole number >= 0"),
        "n": _field(body, "n", int, 1, lambda v: 1 <= v <= MAX_N, f"a whole number from 1 to {MAX_N}"),
        "stream": _field(body, "stream", bool, False, what="true or false"),
        "stop": stops or [],
    }


FORMATS = ("text", "json_object", "json_schema")  # response_format's types


def response_schema(body: dict) -> dict | None:
    """The JSON schema `response_format` asks the output to follow ({"type": "object"} for json_object), or None
    (absent, or {"type": "text"}); a malformed one is a 400 naming the valid choices."""
    rf = body.get("response_format")
    if rf is None:
        return None
    kind = rf.get("type") if isinstance(rf, dict) else None
    if kind not in FORMATS:
        raise ApiError(400, f"'response_format' must be an object whose 'type' is one of {', '.join(FORMATS)}; got "
                            f"{json.dumps(rf)[:80]}", param="response_format")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    spec = rf.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise ApiError(400, "'response_format' of type json_schema needs 'json_schema': {\"name\": ..., \"schema\": "
                            "{a JSON schema object}}", param="response_format")
    return spec["schema"]


def refuse_not_implemented(body: dict, fields: dict) -> None:
    for name, nothing in fields.items():
        value = body.get(name)
        if value not in nothing:
            raise ApiError(400, f"'{name}' is not implemented by zoo-serve (got {json.dumps(value)[:80]}); leave it "
                                f"out", param=name, code="unsupported_parameter")


def parse_json(raw: bytes) -> dict:
    """The request body as a JSON object nested at most MAX_DEPTH deep (a worker thread's job: a large body would
    hold the event loop); else a 400."""
    deep = ApiError(400, f"the request body nests more than {MAX_DEPTH} levels deep")
    try:
        body = json.loads(raw)
    except RecursionError:
        raise deep from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not JSON ({e})") from None
    stack = [(body, 1)]
    while stack:  # without recursion: a deep body is what it looks for
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise deep
        if isinstance(value, (dict, list)):
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value)
                         if isinstance(v, (dict, list)))
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def without_paths(text: str) -> str:
    """text with each absolute path cut to its file's name: a client learns nothing of the server's files."""
    return _PATH.sub(r"\1", text)
