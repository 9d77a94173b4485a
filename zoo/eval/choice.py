"""Multiple choice by log-likelihood, scored as lm-evaluation-harness scores its `multiple_choice` tasks.

A question is a JSONL row {"context": str, "choices": [str, ...], "answer": index}. Each choice's
continuation is `delimiter + choice` (the harness's target_delimiter, " " by default), encoded as the
harness's `_encode_pair` does: trailing whitespace of the context moves to the continuation, the pair is
encoded whole and the continuation's ids are those after the context's own; an empty context is the
prefix token alone (BOS, else end-of-text: zoo.eval.perplexity). The rows are cut on the left to
context + 1 ids, as the harness cuts them to max_length + 1.

- acc: the choice whose continuation has the highest summed log-likelihood is the answer;
- acc_norm: the same with each log-likelihood divided by len(choice), its length in characters (the
  harness's `completion_len`, the choice without the delimiter).

Ties go to the first choice (numpy's argmax), as in the harness.
"""

from __future__ import annotations

import json

import numpy as np

from zoo.data.tokenizers import encode_text
from zoo.errors import ZooDataError
from zoo.eval.jsonl import read_jsonl
from zoo.eval.loglik import Row, score_rows


def read_questions(path: str) -> list[dict]:
    """The questions of a JSONL file, each checked; a bad one is refused naming the file, line and key."""
    return read_jsonl(path, check_question, '{"context": "...", "choices": ["...", ...], "answer": index}')


def check_question(q, where: str) -> dict:
    if not isinstance(q, dict):
        raise ZooDataError(f"{where}: a question is a JSON object, not {type(q).__name__}")
    for key in ("context", "choices", "answer"):
        if key not in q:
            raise ZooDataError(f"{where}: no key {key!r} (keys: {', '.join(map(repr, q)) or 'none'})")
    if not isinstance(q["context"], str):
        raise ZooDataError(f"{where}: key 'context' holds {type(q['context']).__name__}, not text")
    choices = q["choices"]
    if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) and c for c in choices):
        raise ZooDataError(f"{where}: key 'choices' must be a list of at least 2 non-empty strings, "
                           f"not {json.dumps(choices)[:80]}")
    answer = q["answer"]
    if isinstance(answer, bool) or not isinstance(answer, int) or not 0 <= answer < len(choices):
        raise ZooDataError(f"{where}: key 'answer'={json.dumps(answer)[:40]} is not an index of its "
                           f"{len(choices)} choices (0 to {len(choices) - 1})")
    return q


def encode_pair(tokenizer, context: str, continuation: str, prefix: int) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) as lm-evaluation-harness's `_encode_pair` makes them with its `hf` model's
    default encoding (transformers' `tokenizer(text)`: the checkpoint's BOS first where its tokenizer adds one)."""
    if not context:
        return [prefix], tokenizer.encode(continuation)
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = encode_text(tokenizer, context + continuation)
    n = len(encode_text(tokenizer, context))
    return whole[:n], whole[n:]


def question_rows(tokenizer, q: dict, *, prefix: int, context: int, delimiter: str = " ") -> list[Row]:
    rows = []
    for choice in q["choices"]:
        ctx, cont = encode_pair(tokenizer, q["context"], delimiter + choice, prefix)
        if not cont:  # only possible with an empty choice, which check_question refuses
            raise ZooDataError(f"choice {choice!r} encodes to no tokens")
        ids = (ctx + cont)[-(context + 1):]
        rows.append(Row(tuple(ids), min(len(cont), len(ids) - 1)))
    return rows


def predictions(logliks: list[float], choices: list[str]) -> tuple[int, int]:
    """(acc's pick, acc_norm's pick): argmax of the log-likelihoods, and of them over len(choice)."""
    lls = np.asarray(logliks, np.float64)
    return int(np.argmax(lls)), int(np.argmax(lls / np.asarray([float(len(c)) for c in choices])))


def evaluate(model, params, tokenizer, questions: list[dict], *, prefix: int, context: int,
             delimiter: str = " ", batch_size: int = 8, progress=None) -> dict:
    """acc, acc_norm and their counts over `questions`, and each question's per-choice log-likelihoods."""
    rows, sizes = [], []
    for q in questions:
        r = question_rows(tokenizer, q, prefix=prefix, context=context, delimiter=delimiter)
        rows += r
        sizes.append(len(r))
    lls = score_rows(model, params, rows, batch_size=batch_size, max_len=context, progress=progress)
    per_question = np.split(lls, np.cumsum(sizes)[:-1])
    correct = correct_norm = 0
    for q, ll in zip(questions, per_question):
        pick, pick_norm = predictions(ll, q["choices"])
        correct += pick == q["answer"]
        correct_norm += pick_norm == q["answer"]
    n = len(questions)
    return {"questions": n, "acc": correct / n, "acc_norm": correct_norm / n, "correct": correct,
            "correct_norm": correct_norm, "logliks": [ll.tolist() for ll in per_question]}
