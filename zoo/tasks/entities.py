"""Entity-level precision, recall and F1 of IOB2 tag sequences, as seqeval (and CoNLL's conlleval) score
NER by default, and the evaluator that the bert_tokens task (after each evaluation) and zoo-eval share.

A span is (type, first word, last word). As seqeval's default (non-strict) mode reads IOB2: B-X starts a
span; I-X continues the open span if it is of type X, else starts one (an I-X after O or after a span of
another type: CoNLL's lenient reading); O, a B, or a change of type closes it. A predicted span counts
only if its type and both ends equal a true span's. Precision = matched / predicted spans, recall =
matched / true spans, F1 their harmonic mean (0 where a denominator is 0, as seqeval's zero_division).

Implemented here (no dependency); tests/tasks/test_token_classify.py checks it against hand-
computed cases and, where the `seqeval` package is installed, against seqeval itself. Scores come as
sums (`counts`, added over batches and processes) that `scores` divides once. Tags are given by id with
the run's tag names; names that are not all O / B-X / I-X (POS tags, say) have no spans: `is_iob`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

IGNORE = -100  # the label of a position no loss or score reads (later word pieces, [CLS], [SEP], padding)


def parse(tag: str) -> tuple[str, str] | None:
    """("O", "") | ("B", type) | ("I", type); None for a tag that is not IOB2."""
    if tag == "O":
        return "O", ""
    prefix, dash, typ = tag.partition("-")
    return (prefix, typ) if prefix in ("B", "I") and dash and typ else None


def is_iob(names) -> bool:
    """Whether every tag name is IOB2 and some name is an entity's: span scores mean something."""
    parsed = [parse(n) for n in names]
    return all(p is not None for p in parsed) and any(p[0] != "O" for p in parsed)


def spans(tags) -> list[tuple[str, int, int]]:
    """The (type, start, end) spans of one IOB2 sequence (end inclusive), in order."""
    out, start, typ = [], None, ""
    for i, tag in enumerate([*tags, "O"]):  # a closing O ends a span open at the end
        prefix, t = parse(tag) or ("O", "")
        if start is not None and (prefix != "I" or t != typ):
            out.append((typ, start, i - 1))
            start = None
        if prefix == "B" or (prefix == "I" and start is None):
            start, typ = i, t
    return out


def counts(true_seqs, pred_seqs) -> dict:
    """Sums over sequences of tag names: true / pred / tp spans (overall and `_TYPE`), words, correct words."""
    out: dict = {"true": 0, "pred": 0, "tp": 0, "words": 0, "correct": 0}
    for true, pred in zip(true_seqs, pred_seqs):
        t, p = set(spans(true)), set(spans(pred))
        for key, group in (("true", t), ("pred", p), ("tp", t & p)):
            out[key] += len(group)
            for typ, _, _ in group:
                out[f"{key}_{typ}"] = out.get(f"{key}_{typ}", 0) + 1
        out["words"] += len(true)
        out["correct"] += sum(a == b for a, b in zip(true, pred))
    return out


def _prf(tp: int, pred: int, true: int) -> dict:
    p, r = tp / pred if pred else 0.0, tp / true if true else 0.0
    return {"precision": p, "recall": r, "f1": 2 * p * r / (p + r) if p + r else 0.0}


def scores(sums: dict) -> dict:
    """{precision, recall, f1, accuracy (of words), per_type: {TYPE: {precision, recall, f1, support}}}."""
    types = sorted({k.split("_", 1)[1] for k in sums if k.startswith(("true_", "pred_"))})
    per_type = {t: {**_prf(sums.get(f"tp_{t}", 0), sums.get(f"pred_{t}", 0), sums.get(f"true_{t}", 0)),
                    "support": sums.get(f"true_{t}", 0)} for t in types}
    return {**_prf(sums["tp"], sums["pred"], sums["true"]),
            "accuracy": sums["correct"] / sums["words"] if sums["words"] else 0.0, "per_type": per_type}


@functools.partial(jax.jit, static_argnames=("model",))
def _predict(params, ids_BT, segment_ids_BT, valid_BT, *, model):
    return jnp.argmax(model.apply({"params": params}, ids_BT, segment_ids_BT, valid_BT), axis=-1)


def word_tags(model, params, batches) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(true, predicted) tag ids of each real row of `batches` (bert_tokens batches: weight 0 rows are
    padding), at its labelled positions only: one tag per word, as the first piece of each word holds it."""
    if any(len(x.sharding.device_set) > 1 for x in jax.tree.leaves(params)):
        params = jax.device_put(jax.device_get(params), jax.local_devices()[0])  # one device: gathered once
    true, pred = [], []
    for b in batches:
        pred_BT = np.asarray(_predict(params, jnp.asarray(b["inputs"]), jnp.asarray(b["segment_ids"]),
                                      jnp.asarray(b["valid"]), model=model))
        for labels_T, p_T, w in zip(b["labels"], pred_BT, b["weights"]):
            if w > 0:
                at = labels_T != IGNORE
                true.append(labels_T[at])
                pred.append(p_T[at])
    return true, pred


def evaluate(model, params, batches, names) -> dict:
    """counts() of the model's tags on `batches`, tag ids read as `names`."""
    true, pred = word_tags(model, params, batches)
    return counts([[names[i] for i in t] for t in true], [[names[i] for i in p] for p in pred])

