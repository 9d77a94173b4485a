"""The text zoo.cli.results writes: a config docstring's "Expect", "Sample" and "Answers" paragraphs, and the
README's configs-table cell, answer blocks and Evaluate table, each rewritten in place between its own markers."""

from __future__ import annotations

import re
import textwrap

SAMPLE_PARAGRAPH = "Sample (that run's, as train.py prints it at the end: temperature 0.8, top-k 40):"
ANSWERS_PARAGRAPH = "Answers (that run's, greedy: zoo-sample RUN --chat --temperature 0), before -> after:"
EVALUATED = ("gpt_tiny", "llama_tiny", "shakespeare_char", "smollm2_chat_lora")
EVAL_HEADER = ("| run | held-out text | documents | NLL/token | bits/byte | choice `builtin`: acc | acc_norm |\n"
               "| --- | --- | --- | --- | --- | --- | --- |")


def rewrite_answers(config_file: str, readme: str, name: str, lines: list[str]) -> None:
    """The docstring's Answers paragraph (at its end) and the README's answers block of `name`."""
    rewrite_block(config_file, ANSWERS_PARAGRAPH, "\n".join(lines))
    with open(readme) as f:
        text = f.read()
    start, end = f"<!-- answers:{name} -->", "<!-- /answers -->"
    if start in text:
        head, rest = text.split(start, 1)
        tail = rest.split(end, 1)[1]
        text = head + start + "\n```\n" + "\n".join(lines) + "\n```\n" + end + tail
        with open(readme, "w") as f:
            f.write(text)


def rewrite_marked(readme: str, name: str, kind: str, lines: list[str]) -> None:
    """The README's block between <!-- KIND:NAME --> and <!-- /KIND -->, as a code block of `lines`."""
    with open(readme) as f:
        text = f.read()
    start, end = f"<!-- {kind}:{name} -->", f"<!-- /{kind} -->"
    if start in text:
        head, rest = text.split(start, 1)
        text = head + start + "\n```\n" + "\n".join(lines) + "\n```\n" + end + rest.split(end, 1)[1]
        with open(readme, "w") as f:
            f.write(text)


def rewrite_eval_table(readme: str, rows: dict[str, str], when: str) -> None:
    """The README's Evaluate table: the rows of the runs scored now, the others' kept, in EVALUATED's order."""
    with open(readme) as f:
        text = f.read()
    start, end = "<!-- eval-table -->", "<!-- /eval-table -->"
    if start not in text:
        return
    head, rest = text.split(start, 1)
    body, tail = rest.split(end, 1)
    old = {line.split("`")[1]: line for line in body.splitlines() if line.startswith("| `")}
    merged = {**old, **rows}
    order = lambda label: (EVALUATED.index(label.split(" ")[0]) if label.split(" ")[0] in EVALUATED else 99,  # noqa: E731
                           "base" not in label)
    lines = [EVAL_HEADER, *(merged[k] for k in sorted(merged, key=order))]
    text = head + start + f"\n<!-- written by python -m zoo.cli.results ({when}) -->\n" + "\n".join(lines) + "\n" + \
        end + tail
    with open(readme, "w") as f:
        f.write(text)


def rewrite_docstring(path: str, text: str) -> None:
    """Replace the docstring paragraph that starts with "Expect" by `text` (wrapped), or add it."""
    with open(path) as f:
        src = f.read()
    end = src.index('"""', 3)
    doc, rest = src[:end], src[end:]
    wrapped = textwrap.fill(text, 100)
    new, n = re.subn(r"\nExpect\b.*?(?=\n\n|\n?$)", "\n" + wrapped.replace("\\", r"\\"), doc, count=1, flags=re.S)
    if not n:
        new = doc.rstrip("\n") + "\n\n" + wrapped + "\n"
    with open(path, "w") as f:
        f.write(new + rest)


def rewrite_sample(path: str, sample: str) -> None:
    """Replace the docstring's "Sample" paragraph and the indented sample under it (the docstring's
    end) by `sample`, or add them at its end."""
    rewrite_block(path, SAMPLE_PARAGRAPH, sample)


def rewrite_block(path: str, header: str, text: str) -> None:
    """Replace the docstring's paragraph `header` and the indented text under it (the docstring's end) by
    `text`, or add them at its end."""
    with open(path) as f:
        src = f.read()
    end = src.index('"""', 3)
    doc, rest = src[:end], src[end:]
    # Quoted verbatim, indented; nothing in it may end the docstring or start an escape.
    lines = text.rstrip().replace(chr(34) * 3, chr(39) * 3).replace(chr(92), "/").split("\n")
    block = header + "\n\n" + "\n".join(("    " + line).rstrip() for line in lines) + "\n"
    start = doc.find("\n" + header)
    doc = (doc[:start] if start >= 0 else doc).rstrip("\n") + "\n\n" + block
    with open(path, "w") as f:
        f.write(doc + rest)


def rewrite_readme(path: str, name: str, cell: str) -> None:
    """The last cell of the README's configs-table row of `configs/<name>.py`."""
    with open(path) as f:
        lines = f.read().split("\n")
    for i, line in enumerate(lines):
        if line.startswith(f"| `configs/{name}.py` |"):
            cells = line.split(" | ")
            lines[i] = " | ".join(cells[:-1] + [cell + " |"])
    with open(path, "w") as f:
        f.write("\n".join(lines))
