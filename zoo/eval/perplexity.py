"""Perplexity and bits per byte of whole documents, with a sliding window over those longer than the context.

Each document's ids are prefixed with one token, so its first token is scored too, conditioned on that
token alone: the tokenizer's BOS where it has one (Llama's <|begin_of_text|>), else its end-of-text token
(GPT-2's <|endoftext|>, zoo's byte tokenizer's 256), which is what separated documents in training. This
is lm-evaluation-harness's `prefix_token_id` for rolling log-likelihoods. A document of n tokens thus
scores n tokens, and bits per byte divide its whole NLL by its whole UTF-8 length.

The window is transformers' perplexity guide's (https://huggingface.co/docs/transformers/perplexity):
windows of at most `context` tokens of the prefixed sequence start every `stride` tokens; each scores
the tokens after the previous window's end, so every token is scored once, and each after the first
window with at least context - stride tokens before it. The last window ends at the document's end.
"""

from __future__ import annotations

import math

import numpy as np

from zoo.eval.loglik import Row, score_rows, score_tokens


def check_window(context: int, stride: int) -> None:
    """A stride of 1 .. context-1: at `context` the guide's loop skips the first token of each later window."""
    if context < 2:
        raise ValueError(f"the context is {context} tokens; scoring needs at least 2")
    if not 1 <= stride < context:
        raise ValueError(f"--stride {stride} must be between 1 and the context minus one ({context - 1})")


def windows(n: int, context: int, stride: int) -> list[tuple[int, int, int]]:
    """(begin, end, scored) of each window over a sequence of n tokens (the prefix included): the window is
    tokens [begin, end) and its last `scored` tokens are scored, tokens 1 .. n-1 once each in all."""
    check_window(context, stride)
    out, prev_end = [], 0
    for begin in range(0, n, stride):
        end = min(begin + context, n)
        scored = min(end - prev_end, end - begin - 1)  # the first window: all but the prefix
        if scored > 0:
            out.append((begin, end, scored))
        prev_end = end
        if end == n:
            break
    return out


def document_rows(ids: list[int], prefix: int, context: int, stride: int) -> list[Row]:
    seq = [prefix, *ids]
    return [Row(tuple(seq[b:e]), s) for b, e, s in windows(len(seq), context, stride)]


def document_logliks(model, params, docs: list[list[int]], *, prefix: int, context: int, stride: int,
                     batch_size: int = 8, progress=None) -> np.ndarray:
    """float64[len(docs)]: each document's total log-likelihood, every token scored once (empty documents: 0)."""
    rows, owner = [], []
    for d, ids in enumerate(docs):
        r = document_rows(ids, prefix, context, stride)
        rows += r
        owner += [d] * len(r)
    sums = score_rows(model, params, rows, batch_size=batch_size, max_len=context, progress=progress)
    return np.bincount(np.asarray(owner, np.int64), weights=sums, minlength=len(docs))


def document_token_logprobs(model, params, docs: list[list[int]], *, prefix: int, context: int, stride: int,
                            batch_size: int = 8) -> list[np.ndarray]:
    """float32[len(doc)] per document: each token's log-probability, as document_logliks scores it (the first
    conditioned on `prefix`, the windows' scored tails in order); their sums are its totals."""
    rows, owner = [], []
    for d, ids in enumerate(docs):
        r = document_rows(ids, prefix, context, stride)
        rows += r
        owner += [d] * len(r)
    per_row = score_tokens(model, params, rows, batch_size=batch_size, max_len=context)
    out = [[] for _ in docs]
    for d, lp in zip(owner, per_row):
        out[d].append(lp)
    return [np.concatenate(parts) if parts else np.zeros(0, np.float32) for parts in out]


def summary(total_nll: float, tokens: int, n_bytes: int, documents: int) -> dict:
    """The figures zoo-eval reports, from sums."""
    per_token = total_nll / tokens
    return {"documents": documents, "tokens": tokens, "bytes": n_bytes, "nll_per_token": per_token,
            "perplexity": math.exp(per_token), "bits_per_byte": total_nll / math.log(2) / n_bytes}
