"""Text in, labels or tokens out, for a BERT encoder: what Pretrained.classify, .fill_mask and .tag do, and what
zoo-classify and zoo-fill-mask call.

Texts are framed as training frames them ([CLS] a [SEP] (b [SEP]); a converted RoBERTa's or XLM-R's own
<s> a </s></s> b </s>) and run in jitted batches of padded, bucketed rows (zoo.infer.encoder), so any number
of texts compiles a handful of shapes and a text's result does not depend on the others in its batch. A text
longer than the model's positions is refused, not cut (a cut could drop a [MASK] or the words to tag), and so
is one holding a token id outside the model's embedding table (zoo.tasks.mlm.check_ids).

Each call answers as transformers' pipeline does on the same checkpoint: `classify` the softmax over the
classes; `fill_mask` the softmax over the whole vocabulary and its top k, specials included (their text as
the tokenizer writes them: "[SEP]", "</s>"); `tag` the text tokenized whole and each whitespace word's tag read
at its first token.
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
                where=None, softmax: bool = True) -> np.ndarray:
    """probs [N, C] (logits with softmax=False) of a bert_cls model for N texts (and their pairs: a second text
    each, or None for a single text); `where(i)` names text i in errors."""
    from zoo.infer.encoder import class_probs as run
    from zoo.tasks.classify import frame
    from zoo.tasks.mlm import bert_specials, check_ids
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
        check_ids(ids, lm.model.cfg.vocab_size, lm.tokenizer, where(i))
        rows.append(check_length(ids, lm.model.cfg.max_len, where(i)))
        seg_starts.append(seg_start)
    return run(lm.model, lm.params, rows, seg_starts, pad_id=sp.pad, batch_size=batch_size, softmax=softmax)


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


def rerank(lm, query: str, documents, *, top_k: int | None = None, batch_size: int = 32) -> list[dict]:
    """See Pretrained.rerank."""
    from zoo.api.decoder import texts_of
    require(lm, "bert_cls", "rerank")
    if lm.model.cfg.num_classes != 1:
        raise FamilyError(f".rerank needs a cross-encoder (one output); {lm.source!r} classifies into "
                          f"{lm.model.cfg.num_classes} classes: use .classify")
    if not isinstance(query, str):
        raise ArgumentError(f"query must be a string, not {type(query).__name__}")
    docs, _ = texts_of(documents, "documents")
    if top_k is not None and top_k < 1:
        raise ArgumentError(f"top_k={top_k} must be >= 1")
    logits_N1 = class_probs(lm, [query] * len(docs), docs, batch_size=batch_size, softmax=False,
                            where=lambda i: f"the query or document {i}")
    scores_N = 1 / (1 + np.exp(-logits_N1[:, 0].astype(np.float64)))  # CrossEncoder's Sigmoid for one label
    order = np.argsort(-scores_N, kind="stable")[:top_k]
    return [{"corpus_id": int(i), "score": float(scores_N[i])} for i in order]


def fill_mask_ids(lm, texts: list[str], top_k: int = 5, *, batch_size: int = 32, where=None):
    """For each text, for each mask in it (the tokenizer's mask text: "[MASK]", RoBERTa's "<mask>"): the top_k
    (token id, probability) pairs over the whole vocabulary, most likely first (transformers' fill-mask pipeline)."""
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
            raise ArgumentError(f"{where(i)} has no {sp.mask_text}; put one where a token should be predicted")
        mlm.check_ids(ids, lm.model.cfg.vocab_size, lm.tokenizer, where(i))
        rows.append(ids)
    return mask_top_k(lm.model, lm.params, rows, pad_id=sp.pad, mask_id=sp.mask, top_k=top_k, batch_size=batch_size)


def token_text(tokenizer):
    """id -> the text of one token as transformers' fill-mask pipeline writes it: a special's own ("[SEP]",
    "</s>"), where zoo's decoding skips specials."""
    from zoo.tasks import mlm
    specials = mlm.special_texts(tokenizer, mlm.bert_specials(tokenizer))
    return lambda i: specials[i] if i in specials else tokenizer.decode([i])


def filled(text: str, fills: list[list[tuple[int, float]]], tokenizer) -> str:
    """`text` with each mask replaced by its most likely token."""
    from zoo.tasks.mlm import bert_specials
    text_of = token_text(tokenizer)
    best = iter(text_of(row[0][0]) for row in fills)
    pieces = text.split(bert_specials(tokenizer).mask_text)
    return "".join(piece if i == 0 else next(best) + piece for i, piece in enumerate(pieces))


def fill_mask(lm, texts, *, top_k: int = 5, batch_size: int = 32):
    """See Pretrained.fill_mask."""
    from zoo.api.decoder import texts_of
    items, single = texts_of(texts, "texts")
    fills = fill_mask_ids(lm, items, top_k, batch_size=batch_size)
    text_of = token_text(lm.tokenizer)
    out = [[[(text_of(t), p) for t, p in m] for m in f] for f in fills]
    return out[0] if single else out


def first_tokens(text: str, starts: list[int]) -> list[tuple[str, int | None]]:
    """(word, index of its first token) of each whitespace-separated word of `text`, given each token's start
    character (a token runs to the next one's start): the first token that starts in the word or runs into it
    (None: no token does)."""
    import re
    ends, out, j = [*starts[1:], len(text)], [], 0
    for m in re.finditer(r"\S+", text):
        while j < len(starts) and starts[j] < m.start() and ends[j] <= m.start():
            j += 1
        out.append((m.group(), j if j < len(starts) and starts[j] < m.end() else None))
    return out


def tag(lm, texts, *, batch_size: int = 32):
    """See Pretrained.tag."""
    from zoo.api.decoder import texts_of
    from zoo.infer.encoder import best_tags
    from zoo.tasks.mlm import bert_specials, check_ids
    require(lm, "bert_tokens", "tag")
    items, single = texts_of(texts, "texts")
    names = class_names(lm)
    sp = bert_specials(lm.tokenizer)
    rows, words = [], []
    for i, text in enumerate(items):
        # The text tokenized whole, as transformers' pipeline tokenizes it (RoBERTa's first word without a space).
        ids, starts = lm.tokenizer.encode_with_offsets(text)
        words.append(first_tokens(text, starts))
        if not words[i]:
            raise ArgumentError(f"text {i} is empty")
        lost = next((w for w, j in words[i] if j is None), None)
        if lost is not None:
            raise ArgumentError(f"text {i}: the word {lost!r} has no token (the tokenizer drops it); remove it")
        row = check_length([sp.cls, *ids, sp.sep], lm.model.cfg.max_len, f"text {i}")
        check_ids(row, lm.model.cfg.vocab_size, lm.tokenizer, f"text {i}")
        rows.append(row)
    best = best_tags(lm.model, lm.params, rows, pad_id=sp.pad, batch_size=batch_size)
    out = [[(w, names[int(b[1 + j])]) for w, j in ws] for ws, b in zip(words, best)]
    return out[0] if single else out
