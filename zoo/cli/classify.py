"""Classify text with a fine-tuned [CLS] classifier run: class probabilities, most likely first.

    zoo-classify runs/cls --text "The for statement is used to iterate over a sequence"
    zoo-classify runs/glue --text "A man is playing." --pair "Someone plays."   # sentence pairs

Class names come from the run's labels.json, else its config (data.label_names), else the
labelled source named in its config. A text longer than the model's positions is refused here
(training data is truncated instead, and counted).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from zoo.cli import BAD_INPUT, error
from zoo.cli.fill_mask import encode_checked


def class_names(workdir: str, cfg) -> list[str]:
    path = os.path.join(workdir, "labels.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    from zoo.tasks.classify import label_names
    return label_names(cfg)


def predict(model, params, tokenizer, text: str, pair: str | None = None) -> np.ndarray:
    """Class probabilities [C] for one text (or text pair)."""
    import jax
    import jax.numpy as jnp
    from zoo.tasks.classify import frame
    from zoo.tasks.mlm import bert_specials
    for what, t in (("--text", text), ("--pair", pair)):
        if t is not None and not t.strip():
            raise ValueError(f"{what} is empty")
    sp = bert_specials(tokenizer)
    ids, seg_start = frame(tokenizer.encode(text), tokenizer.encode(pair) if pair else None, sp)
    ids_1T = encode_checked(ids, model.cfg.max_len)
    segment_ids_1T = (np.arange(ids_1T.shape[1]) >= seg_start).astype(np.int32)[None]
    logits_1C = model.apply({"params": params}, jnp.asarray(ids_1T), jnp.asarray(segment_ids_1T),
                            jnp.ones(ids_1T.shape, bool))
    return np.asarray(jax.nn.softmax(logits_1C[0]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="zoo-classify", description=__doc__.split("\n")[0])
    ap.add_argument("workdir", help="a bert_cls run directory (train.py --workdir)")
    ap.add_argument("--text", required=True, help="the text to classify")
    ap.add_argument("--pair", default=None, help="second text, for sentence-pair classifiers (default: none)")
    a = ap.parse_args(argv)
    from zoo.train.checkpoint import load_run
    try:
        model, params, tok, cfg = load_run(a.workdir, "bert_cls")
        probs = predict(model, params, tok, a.text, a.pair)
        names = class_names(a.workdir, cfg)
    except BAD_INPUT as e:
        return error(e)
    for c in np.argsort(-probs):
        print(f"{probs[c]:.3f}  {names[c]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
