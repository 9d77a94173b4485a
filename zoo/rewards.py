"""Reward functions for reinforcement learning (task=grpo), with TRL's and Tunix's signature:

    reward(prompts, completions, **columns) -> list[float]

`prompts` and `completions` are lists of strings, or for a conversational source lists of messages (a completion
is then [{"role": "assistant", "content": ...}]); `columns` holds the source's other columns, one value per
completion (e.g. `answer`). Name yours in the config as MODULE:FUNCTION or FILE.py:FUNCTION (grpo.rewards). These
two are zoo's own, used by configs/smollm2_grpo_lora.py.
"""

from __future__ import annotations

import re

ANSWER = re.compile(r"answer is\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def text_of(completion) -> str:
    """A completion's text: the string, or the content of a conversational completion's messages."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content", "") for m in completion if isinstance(m, dict))


def final_answer(text: str) -> str | None:
    """The number after "answer is", else the last number in the text, else None."""
    m = ANSWER.search(text)
    if m:
        return m.group(1)
    numbers = NUMBER.findall(text)
    return numbers[-1] if numbers else None


def exact_answer(prompts, completions, answer, **columns) -> list[float]:
    """1.0 where the completion's final answer (final_answer) equals the `answer` column (as numbers when both
    are), else 0.0."""
    out = []
    for completion, want in zip(completions, answer):
        got = final_answer(text_of(completion))
        out.append(float(got is not None and _same(got, str(want))))
    return out


def _same(a: str, b: str) -> bool:
    try:
        return float(a) == float(b)
    except ValueError:
        return a.strip() == b.strip()


def answer_format(prompts, completions, **columns) -> list[float]:
    """1.0 where the completion is one sentence ending "The answer is N." (a number, a full stop, nothing after),
    0.5 where it says "answer is N" somewhere, else 0.0."""
    out = []
    for completion in completions:
        text = text_of(completion).strip()
        if re.fullmatch(r"(?:[^\n]*?\s)?The answer is -?\d+(?:\.\d+)?\.", text):
            out.append(1.0)
        else:
            out.append(0.5 if ANSWER.search(text) else 0.0)
    return out
