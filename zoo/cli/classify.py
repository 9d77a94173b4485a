"""Classify text with a fine-tuned [CLS] classifier run: class probabilities, most likely first.

    zoo-classify runs/cls --text "The for statement is used to iterate over a sequence"
    zoo-classify runs/glue --text "A man is playing." --pair "Someone plays."   # sentence pairs
    zoo-classify runs/cls --file texts.jsonl --out labels.jsonl   # {"text": ..., "pair": ...} a line (or .txt)

Class names come from the run's labels.json, else its config (data.label_names), else the
labelled source named in its config. A text longer than the model's positions is refused here
(training data is truncated instead, and counted).

With --file (zoo.cli.inputs) the texts run in jitted batches of --batch-size (zoo.infer.encoder) and
each gives one JSON line: {"text": ..., ("pair": ...,) "label": the most likely class, "probs": {class: p}}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from zoo.cli import BAD_INPUT, error
from zoo.cli.fill_mask import check_length, encode_checked, jitted_apply


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
    logits_1C = jitted_apply(model)(params, jnp.asarray(ids_1T), jnp.asarray(segment_ids_1T),
                                    jnp.ones(ids_1T.shape, bool))
    return np.asarray(jax.nn.softmax(logits_1C[0]))


def predict_lines(model, params, tokenizer, lines, batch_size: int = 32) -> np.ndarray:
    """probs [N, C] for the lines of a file (zoo.cli.inputs.Line: text, optional pair), batched; errors
    name the line."""
    from zoo.infer.encoder import class_probs
    from zoo.tasks.classify import frame
    from zoo.tasks.mlm import bert_specials
    sp = bert_specials(tokenizer)
    enc_a = tokenizer.encode_batch([line.text for line in lines])
    rows, seg_starts = [], []
    for line, a in zip(lines, enc_a):
        ids, seg_start = frame(a, tokenizer.encode(line.pair) if line.pair is not None else None, sp)
        rows.append(check_length(ids, model.cfg.max_len, line.where))
        seg_starts.append(seg_start)
    return class_probs(model, params, rows, seg_starts, pad_id=sp.pad, batch_size=batch_size)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="zoo-classify", description=__doc__.split("\n")[0])
    ap.add_argument("workdir", help="a bert_cls run directory (train.py --workdir)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="the text to classify")
    src.add_argument("--file", default=None, metavar="PATH",
                     help='texts to classify: .txt (one a line) or .jsonl ({"text": ..., "pair": ...} a line); '
                          'prints JSON lines')
    ap.add_argument("--pair", default=None, help="second text, for sentence-pair classifiers (default: none)")
    ap.add_argument("--batch-size", type=int, default=32, metavar="N",
                    help="texts per batch with --file (default: %(default)s)")
    ap.add_argument("--out", default=None, metavar="PATH", help="write the output to this file (default: stdout)")
    a = ap.parse_args(argv)
    from zoo.cli import inputs
    from zoo.train.runs import load_run
    try:
        if a.file is not None and a.pair is not None:
            raise ValueError('--pair goes with --text; with --file give each .jsonl line a "pair" field')
        if a.batch_size < 1:
            raise ValueError(f"--batch-size={a.batch_size} must be >= 1")
        lines = inputs.read_lines(a.file, pairs=True) if a.file is not None else None
        inputs.check_out(a.out)
        model, params, tok, cfg = load_run(a.workdir, "bert_cls")
        if lines is not None:
            probs_NC = predict_lines(model, params, tok, lines, a.batch_size)
        else:
            probs = predict(model, params, tok, a.text, a.pair)
        names = class_names(a.workdir, cfg)
    except BAD_INPUT as e:
        return error(e)
    if lines is None:
        inputs.write(a.out, [f"{probs[c]:.3f}  {names[c]}" for c in np.argsort(-probs)])
        return 0
    inputs.write(a.out, inputs.jsonl(
        {"text": line.text, **({"pair": line.pair} if line.pair is not None else {}),
         "label": names[int(np.argmax(p_C))], "probs": {n: float(p) for n, p in zip(names, p_C)}}
        for line, p_C in zip(lines, probs_NC)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
