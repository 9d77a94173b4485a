"""Reading a JSONL file of rows for zoo-eval's tasks (questions, prompts and answers): each row checked,
a bad one refused in one line naming the file, the line and what is wrong."""

from __future__ import annotations

import json

from zoo.errors import ZooDataError


def read_jsonl(path: str, check, shape: str) -> list[dict]:
    """The rows of a JSONL file, each through `check(row, "PATH:LINE")`; ZooDataError naming the file (and
    line) for an unreadable file, a line that is not JSON, or no rows (`shape`: what a row looks like)."""
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            lines = list(f)
    except OSError as e:
        raise ZooDataError(f"{path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ZooDataError(f"{path} is not UTF-8 text ({e.reason})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise ZooDataError(f"{path}:{n} is not JSON ({e})") from None
        out.append(check(row, f"{path}:{n}"))
    if not out:
        raise ZooDataError(f"{path} holds no {'questions' if 'choices' in shape else 'rows'}; each line is {shape}")
    return out
