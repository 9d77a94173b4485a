"""Texts for batch inference from a file (zoo-classify and zoo-fill-mask --file), and where results go.

    .txt    one text a line; blank lines are skipped
    .jsonl  one JSON object a line with a string "text" field (and, for zoo-classify, an optional string
            "pair": the second text of a sentence pair); blank lines are skipped, other fields ignored

Each text keeps its line number (from 1), so an error (bad JSON, no text, too long, no [MASK]) names the
line. Results are JSON lines, one per text in input order, on stdout or in --out.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

SUPPORTED = {".txt": "one text a line", ".jsonl": 'one JSON object a line with a "text" field'}


@dataclass(frozen=True)
class Line:
    """One text of a file, and how an error names it ("line 3 of texts.jsonl")."""

    where: str
    text: str
    pair: str | None = None


def _parse_jsonl(line: str, where: str, pairs: bool) -> Line:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where} is not JSON ({e.msg} at column {e.colno}); each line must be an object "
                         f'such as {{"text": "..."}}') from None
    if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
        raise ValueError(f'{where} has no "text" string field; each line must be an object such as {{"text": "..."}}')
    pair = obj.get("pair") if pairs else None
    if pair is not None and not isinstance(pair, str):
        raise ValueError(f'{where}: "pair" holds {type(pair).__name__}, not a string')
    for field, value in (("text", obj["text"]), ("pair", pair)):
        if value is not None and not value.strip():
            raise ValueError(f'{where}: "{field}" is empty')
    return Line(where, obj["text"], pair)


def read_lines(path: str, pairs: bool = False) -> list[Line]:
    """The texts of a .txt or .jsonl file (with a "pair" each where `pairs`), blank lines skipped."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in SUPPORTED:
        raise ValueError(f"--file={path!r} has unsupported type {ext or '(no extension)'}; supported: "
                         + "; ".join(f"{e} ({what})" for e, what in SUPPORTED.items()))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--file={path!r}: no such file")
    try:
        with open(path, encoding="utf-8") as f:
            raw = f.read().split("\n")
    except UnicodeDecodeError as e:
        raise ValueError(f"--file={path!r} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    out = []
    for n, line in enumerate(raw, 1):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        where = f"line {n} of {path}"
        out.append(_parse_jsonl(line, where, pairs) if ext == ".jsonl" else Line(where, line))
    if not out:
        raise ValueError(f"--file={path!r} has no texts (only blank lines)")
    return out


def check_out(path: str | None) -> None:
    """Refuse an --out whose folder is missing or takes no new file (read-only, /proc) before any work is done."""
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"--out={path!r}: no such folder {os.path.dirname(path)!r}")
    if os.path.isdir(path):
        raise ValueError(f"--out={path!r} is a folder; name a file to write")
    try:  # a file can be made there: made and removed at once
        import tempfile
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".zoo-out-"):
            pass
    except OSError as e:
        raise ValueError(f"--out={path!r}: cannot write in {folder!r} ({e.strerror or e})") from None


def write(path: str | None, lines: list[str]) -> None:
    """Lines of output to `path` (stdout when None)."""
    if path is None:
        sys.stdout.writelines(line + "\n" for line in lines)
        return
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in lines)
    except OSError as e:
        raise ValueError(f"--out={path!r}: writing it failed ({e.strerror or e})") from None


def jsonl(objs) -> list[str]:
    return [json.dumps(o, ensure_ascii=False) for o in objs]
