"""Generation evaluation for chat and instruction runs: each row's prompt answered greedily, scored by exact
match and by whether the answer contains the expected one (both after normalising case and whitespace), and
the worst rows kept for printing.

A row of the JSONL file is {"messages": [{"role", "content"}, ...], "answer": "..."} (the conversation up to
the user's last turn, rendered with the run's chat template, zoo.infer.chat) or {"prompt": "...", "answer":
"..."} (plain text continued as it is); "answer" may be a list of acceptable answers. The answer is cut at the
tokenizer's end-of-text or end-of-turn token.
"""

from __future__ import annotations

import re

from zoo.data.chat import check_messages
from zoo.errors import ZooDataError
from zoo.eval.jsonl import read_jsonl

SHAPE = '{"messages": [{"role": "user", "content": "..."}], "answer": "..."} or {"prompt": "...", "answer": "..."}'


def read_items(path: str) -> list[dict]:
    """The rows of a JSONL file, each checked; a bad one is refused naming the file, line and key."""
    return read_jsonl(path, check_item, SHAPE)


def check_item(row, where: str) -> dict:
    if not isinstance(row, dict):
        raise ZooDataError(f"{where}: a row is a JSON object, not {type(row).__name__}; each line is {SHAPE}")
    if ("messages" in row) == ("prompt" in row):
        raise ZooDataError(f"{where}: give exactly one of 'messages' and 'prompt' (keys: "
                           f"{', '.join(map(repr, row)) or 'none'})")
    if "messages" in row:
        check_messages(row["messages"], f"{where}: 'messages'")
    elif not isinstance(row["prompt"], str) or not row["prompt"]:
        raise ZooDataError(f"{where}: 'prompt' must be a non-empty string")
    answers = row.get("answer")
    answers = [answers] if isinstance(answers, str) else answers
    if not isinstance(answers, list) or not answers or not all(isinstance(x, str) and x.strip() for x in answers):
        raise ZooDataError(f"{where}: 'answer' must be a non-empty string or a list of them")
    return {**row, "answers": answers}


def normalise(text: str) -> str:
    """Case folded, whitespace collapsed, trimmed (and a final full stop dropped): what both scores compare."""
    return re.sub(r"\s+", " ", text).strip().casefold().rstrip(".").strip()


def score(got: str, answers: list[str]) -> tuple[bool, bool]:
    """(exact match, contains): against any of the acceptable answers."""
    g = normalise(got)
    return any(g == normalise(a) for a in answers), any(normalise(a) in g for a in answers)


def evaluate(model, params, tok, tokenizer_name: str, items: list[dict], *, run_dir: str | None, window: int,
             max_new_tokens: int, batch_size: int = 8, progress=None) -> dict:
    """Greedy answers to `items`: counts of exact and contained answers, and every row's answer and scores. The
    prompts decode `batch_size` at a time in KV-cached batches (zoo.infer.sample.generate_batch: sorted by
    length, so each batch pads little and prompts of one length bucket share a program), each answer stopping
    at the tokenizer's end-of-text or end-of-turn token; a prompt too long for the window with max_new_tokens
    is answered alone, its context cropped. `progress(n)` after each batch."""
    from zoo.data.tokenizers import encode_text
    from zoo.infer.chat import prompt_ids
    prompts = [item["prompt_ids"] if "prompt_ids" in item else  # ids rendered already (zoo.tasks.sft)
               prompt_ids(tok, tokenizer_name, item["messages"], run_dir) if "messages" in item
               else encode_text(tok, item["prompt"]) for item in items]
    answers = greedy_ids(model, params, tok, prompts, window=window, max_new_tokens=max_new_tokens,
                         batch_size=batch_size, progress=progress)
    rows, exact, contains = [], 0, 0
    for i, (item, ids) in enumerate(zip(items, answers)):
        got = tok.decode(ids)
        em, ct = score(got, item["answers"])
        exact, contains = exact + em, contains + ct
        rows.append({"index": item.get("index", i), "answer": got, "expected": item["answers"][0],
                     "exact_match": em, "contains": ct})
    return {"items": len(items), "exact": exact, "contained": contains, "rows": rows}


def greedy_ids(model, params, tok, prompts: list[list[int]], *, window: int, max_new_tokens: int, batch_size: int = 8,
               progress=None) -> list[list[int]]:
    """Each prompt's greedy answer (new ids, cut before the end-of-text or end-of-turn id): `batch_size` prompts a
    KV-cached batch, sorted by length (zoo.infer.sample.generate_batch); one too long for the window with
    max_new_tokens alone, its context cropped. `progress(n)` after each batch. evaluate's decoding, and
    data.mix_source=replay's (zoo.tasks.sft_replay)."""
    from zoo.infer.sample import generate, generate_batch, stop_ids
    kw = dict(temperature=0.0, eos_id=stop_ids(tok), vocab_limit=tok.n_vocab, window=window)
    answers: list = [None] * len(prompts)
    fits = sorted((i for i, p in enumerate(prompts) if len(p) + max_new_tokens <= window), key=lambda i: len(prompts[i]))
    for start in range(0, len(fits), batch_size):
        chunk = fits[start:start + batch_size]
        for i, ids in zip(chunk, generate_batch(model, params, [prompts[i] for i in chunk], max_new_tokens, **kw)):
            answers[i] = ids
        if progress:
            progress(len(chunk))
    for i in (i for i, a in enumerate(answers) if a is None):
        answers[i] = generate(model, params, prompts[i], max_new_tokens, **kw)[0]
        if progress:
            progress(1)
    return answers


def worst(rows: list[dict], n: int) -> list[dict]:
    """The `n` rows to look at first: no expected answer contained, then contained but not exact (file order)."""
    return sorted([r for r in rows if not r["exact_match"]], key=lambda r: (r["contains"], r["index"]))[:n]
