"""A [CLS] classifier run scored on a labelled source: accuracy, macro-F1 over the classes present, and the
confusion matrix (rows: the true class, columns: the predicted one).

The source is read as training reads one (zoo.tasks.classify.load_examples: builtin, a local file or
directory, hub:NAME; its text, optional pair and label columns), its labels mapped to the run's own class
names (a string label the run does not know is refused in one line). A text longer than the model's
positions is cut as training cuts it (zoo.tasks.classify.truncate) and counted."""

from __future__ import annotations

import dataclasses

import numpy as np


def evaluate(model, params, tokenizer, run_cfg, names: list[str], data_cfg, *, batch_size: int = 32,
             max_rows: int | None = None, progress=None) -> dict:
    """{examples, accuracy, macro_f1, confusion, classes, truncated} of the run on the source `data_cfg` (a
    DataConfig whose source and columns say what to read)."""
    from zoo.infer.encoder import class_probs
    from zoo.tasks import classify
    from zoo.tasks.mlm import bert_specials
    ds = classify.load_examples(data_cfg)
    if max_rows is not None:
        ds = ds.select(range(min(max_rows, len(ds))))
    by_name = dataclasses.replace(data_cfg, label_names=",".join(names))  # the run's ids for string labels
    labels, _ = classify.resolve_labels(ds.select_columns([data_cfg.label_column]), by_name, len(names))
    texts = list(ds[data_cfg.text_column])
    pairs = list(ds[data_cfg.text_pair_column]) if data_cfg.text_pair_column else None
    sp = bert_specials(tokenizer)
    enc_a = tokenizer.encode_batch(texts)
    enc_b = tokenizer.encode_batch(pairs) if pairs is not None else [None] * len(texts)
    budget = model.cfg.max_len - sp.n_framing(pairs is not None)
    rows, starts, truncated = [], [], 0
    for a, b in zip(enc_a, enc_b):
        ta, tb = classify.truncate(a, b, budget)
        truncated += (len(ta), len(tb or [])) != (len(a), len(b or []))
        ids, start = classify.frame(ta, tb, sp)
        rows.append(ids)
        starts.append(start)
    probs = class_probs(model, params, rows, starts, pad_id=sp.pad, batch_size=batch_size)
    if progress:
        progress(len(rows))
    pred = probs.argmax(-1)
    C = len(names)
    confusion = np.zeros((C, C), np.int64)
    np.add.at(confusion, (labels, pred), 1)
    f1s = [2 * confusion[c, c] / (confusion[c].sum() + confusion[:, c].sum()) for c in range(C)
           if confusion[c].sum() + confusion[:, c].sum() > 0]
    return {"examples": len(rows), "accuracy": float((pred == labels).mean()), "macro_f1": float(np.mean(f1s)),
            "confusion": confusion.tolist(), "classes": list(names), "truncated": truncated}
