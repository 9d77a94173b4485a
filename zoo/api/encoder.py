"""Text in, labels or tokens out, for a BERT encoder: what Pretrained.classify, .fill_mask and .tag do, and what
zoo-classify and zoo-fill-mask call.

Texts are framed as training frames them ([CLS] a [SEP] (b [SEP])) and run in jitted batches of padded,
bucketed rows (zoo.infer.encoder), so any number of texts compiles a handful of shapes and a text's result
does not depend on the others in its batch. A text longer than the model's positions is refused, not cut
(a cut could drop a [MASK] or the words to tag).
"""

from __future__ import annotations

import json
import os

import numpy as np

from zoo.errors import ArgumentError, FamilyError


def require(lm, task: str, method: str) -> None:
    if lm.config.task != task:
        raise FamilyError(f".{method} needs a {task} model; {lm.source!r} is a {lm.config.model.family} model of "
                          f"task {lm.config.task}, which offers {', '.join(lm.offers())}")


def check_length(ids: list[int], max_len: int, what: str = "the text") -> list[int]:
    if len(ids) > max_len:
        raise ArgumentError(f"{what} is {len(ids)} tokens with [CLS] and [SEP], more than the model's "
                            f"max_len={max_len}; shorten it")
    return ids


def class_names(lm) -> list[str]:
    """A classifier's class names in id order: the run's labels.json, else its config (data.label_names), else the
    labelled source named in its config."""
    path = os.path.join(lm.run_dir, "labels.json") if lm.run_dir else None
    if path and os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    from zoo.tasks.classify import label_names
    return label_names(lm.config)


def class_probs(lm, texts: list[str], pairs: list[str] | None = None, *, batch_size: int = 32,
                where=None) -> np.ndarray:
    """probs [N, C] of a bert_cls model for N texts (and their pairs: a second text each, or None for a single
    text); `where(i)` names text i in errors."""
    from zoo.infer.encoder import class_probs as run
    from zoo.tasks.classify import frame
    from zoo.tasks.mlm import bert_specials
    require(lm, "bert_cls", "classify")
    where = where or (lambda i: f"text {i}")
    sp = bert_specials(lm.tokenizer)
    rows, seg_starts = [], []
    enc_a = lm.tokenizer.encode_batch(texts)
    for i, a in enumerate(enc_a):
        pair = pairs[i] if pairs is not None else None  # None: a single text
        if not texts[i].strip() or (pair is not None and not pair.strip()):
            raise ArgumentError(f"{where(i)} is empty")
        ids, seg_start = frame(a, lm.tokenizer.encode(pair) if pair is not None else None, sp)
        rows.append(check_length(ids, lm.model.cfg.max_len, where(i)))
        seg_starts.append(seg_start)
    return run(lm.model, lm.params, rows, seg_starts, pad_id=sp.pad, batch_size=batch_size)


def classify(lm, texts, pairs=None, *, batch_size: int = 32):
    """See Pretrained.classify."""
    from zoo.api.decoder import texts_of
    items, single = texts_of(texts, "texts")
    if pairs is not None:
        pairs, _ = texts_of(pairs, "pairs")
        if len(pairs) != len(items):
            raise ArgumentError(f"pairs: {len(pairs)} given for {len(items)} texts; give one per text")
    probs_NC = class_probs(lm, items, pairs, batch_size=batch_size)
    names = class_names(lm)
    out = [{"label": names[int(np.argmax(p))], "probs": {n: float(x) for n, x in zip(names, p)}} for p in probs_NC]
    return out[0] if single else out


def fill_mask_ids(lm, texts: list[str], top_k: int = 5, *, batch_size: int = 32, where=None):
    """For each text, for each [MASK] in it: the top_k (token id, probability) pairs, most likely first."""
    from zoo.infer.encoder import mask_top_k
    from zoo.tasks import mlm
    require(lm, "bert_mlm", "fill_mask")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ArgumentError(f"top_k={top_k!r} must be a whole number >= 1")
    where = where or (lambda i: f"text {i}")
    sp = mlm.bert_specials(lm.tokenizer)
    rows = []
    for i, text in enumerate(texts):
        if not text.strip():
            raise ArgumentError(f"{where(i)} is empty")
        ids = check_length(mlm.encode_masked(text, lm.tokenizer, sp), lm.model.cfg.max_len, where(i))
        if sp.mask not in ids:
            raise ArgumentError(f"{where(i)} has no {mlm.SPECIALS[2]}; put one where a token should be predicted")
        rows.append(ids)
    return mask_top_k(lm.model, lm.params, rows, pad_id=sp.pad, mask_id=sp.mask, start=sp.ordinary_start,
                      stop=sp.n_ordinary, top_k=top_k, batch_size=batch_size)


def filled(text: str, fills: list[list[tuple[int, float]]], tokenizer) -> str:
    """`text` with each [MASK] replaced by its most likely token."""
    from zoo.tasks.mlm import SPECIALS
    best = iter(tokenizer.decode([row[0][0]]) for row in fills)
    return "".join(piece if i == 0 else next(best) + piece for i, piece in enumerate(text.split(SPECIALS[2])))


def fill_mask(lm, texts, *, top_k: int = 5, batch_size: int = 32):
    """See Pretrained.fill_mask."""
    from zoo.api.decoder import texts_of
    items, single = texts_of(texts, "texts")
    fills = fill_mask_ids(lm, items, top_k, batch_size=batch_size)
    out = [[[(lm.tokenizer.decode([t]), p) for t, p in m] for m in f] for f in fills]
    return out[0] if single else out


def tag(lm, texts, *, batch_size: int = 32):
    """See Pretrained.tag."""
    import jax
    import jax.numpy as jnp
    from zoo.api.decoder import texts_of
    from zoo.infer.encoder import batches
    from zoo.tasks import token_classify
    from zoo.tasks.mlm import bert_specials
    require(lm, "bert_tokens", "tag")
    items, single = texts_of(texts, "texts")
    words = [t.split() for t in items]
    for i, w in enumerate(words):
        if not w:
            raise ArgumentError(f"text {i} is empty")
    names = class_names(lm)
    ex, _ = token_classify.encode(lm.tokenizer, bert_specials(lm.tokenizer), words,
                                  [np.zeros(len(w), np.int32) for w in words], lm.model.cfg.max_len)
    for i in range(len(words)):  # a word cut off (or of no tokens) would get no tag
        if (ex.labels[i] != token_classify.IGNORE).sum() < len(words[i]):
            raise ArgumentError(f"text {i} is longer than the model's max_len={lm.model.cfg.max_len} tokens with "
                                f"[CLS] and [SEP]; shorten it")
    apply = jax.jit(lambda p, ids, seg, valid: lm.model.apply({"params": p}, ids, seg, valid))
    out: list = [None] * len(words)
    T = min(lm.model.cfg.max_len, -(-int(ex.lengths.max()) // 8) * 8)
    for idx in batches(list(ex.lengths), batch_size):
        rows = ex.rows(idx)
        logits_BTC = apply(lm.params, jnp.asarray(rows["inputs"][:, :T]), jnp.asarray(rows["segment_ids"][:, :T]),
                           jnp.asarray(rows["valid"][:, :T]))
        best_BT = np.asarray(jnp.argmax(logits_BTC, -1))
        for b, i in enumerate(idx):
            starts = np.flatnonzero(ex.labels[i, :T] != token_classify.IGNORE)
            out[i] = [(w, names[int(best_BT[b, s])]) for w, s in zip(words[i], starts)]
    return out[0] if single else out
