"""Classify text with a fine-tuned [CLS] classifier run: class probabilities, most likely first.

    zoo-classify runs/cls --text "The for statement is used to iterate over a sequence"
    zoo-classify runs/glue --text "A man is playing." --pair "Someone plays."   # sentence pairs
    zoo-classify runs/cls --file texts.jsonl --out labels.jsonl   # {"text": ..., "pair": ...} a line (or .txt)

Class names come from the run's labels.json, else its config (data.label_names), else the
labelled source named in its config. A text longer than the model's positions is refused here
(training data is truncated instead, and counted).

A shell over zoo.load(...) and zoo.api.encoder (Pretrained.classify): the texts run in jitted batches of
--batch-size (zoo.infer.encoder). With --file (zoo.cli.inputs) each gives one JSON line: {"text": ...,
("pair": ...,) "label": the most likely class, "probs": {class: p}}.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from zoo.api import encoder
from zoo import runtime
from zoo.cli import BAD_INPUT, error


def main(argv=None) -> int:
    runtime.prepare_command()  # the compilation cache, XLA's log level: before jax starts
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
    try:
        if a.file is not None and a.pair is not None:
            raise ValueError('--pair goes with --text; with --file give each .jsonl line a "pair" field')
        if a.batch_size < 1:
            raise ValueError(f"--batch-size={a.batch_size} must be >= 1")
        lines = inputs.read_lines(a.file, pairs=True) if a.file is not None else [inputs.Line("--text", a.text, a.pair)]
        inputs.check_out(a.out)
        import zoo
        lm = zoo.load(a.workdir)
        encoder.require(lm, "bert_cls", "classify")
        probs_NC = encoder.class_probs(lm, [line.text for line in lines], [line.pair for line in lines], batch_size=a.batch_size,
                                       where=lambda i: lines[i].where)
        names = encoder.class_names(lm)
    except BAD_INPUT as e:
        return error(e)
    if a.file is None:
        inputs.write(a.out, [f"{probs_NC[0][c]:.3f}  {names[c]}" for c in np.argsort(-probs_NC[0])])
        return 0
    inputs.write(a.out, inputs.jsonl(
        {"text": line.text, **({"pair": line.pair} if line.pair is not None else {}),
         "label": names[int(np.argmax(p_C))], "probs": {n: float(p) for n, p in zip(names, p_C)}}
        for line, p_C in zip(lines, probs_NC)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
