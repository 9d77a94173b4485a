"""Translate with a trained seq2seq run: greedy (--beam 1) or beam search, one output line per input. A shell
over zoo.load(...).translate (zoo.api.seq2seq).

    zoo-translate runs/s2s --text "the class object is created by calling" --beam 4
    printf 'first input\\nsecond input\\n' | zoo-translate runs/s2s --beam 1

Inputs longer than the run's data.seq_len tokens are refused (training truncated them; decoding
does not guess). Output length is capped by --max-len (default: the run's data.seq_len). A run
converted from (or fine-tuned from) a T5 or BART checkpoint frames inputs and ranks beams as
transformers does, with the checkpoint's length_penalty and early_stopping (zoo.tasks.seq2seq_data.Framing).
"""

from __future__ import annotations

import argparse
import sys

from zoo import runtime
from zoo.cli import BAD_INPUT, error


def main(argv=None) -> int:
    runtime.prepare_command()  # the compilation cache, XLA's log level: before jax starts
    ap = argparse.ArgumentParser(prog="zoo-translate", description=__doc__.split("\n")[0])
    ap.add_argument("workdir", help="a seq2seq run directory with checkpoints (train.py --workdir)")
    ap.add_argument("--text", action="append", help="an input (repeatable); default: one per line from stdin")
    ap.add_argument("--beam", type=int, default=4, help="beam size; 1 is greedy decoding (default: %(default)s)")
    ap.add_argument("--length-penalty", type=float, default=None,
                    help="alpha of the run's length penalty (default: 0.6 GNMT for zoo runs, the checkpoint's for "
                         "converted ones); 0 ranks by log-probability")
    ap.add_argument("--max-len", type=int, default=None, help="most output tokens (default: the run's data.seq_len)")
    a = ap.parse_args(argv)
    try:
        if a.beam < 1:
            raise ValueError(f"beam size {a.beam} must be >= 1 (1 is greedy decoding)")
        texts = a.text if a.text else [line.rstrip("\n") for line in sys.stdin if line.strip()]
        if not texts:
            raise ValueError("no input: give --text or lines on stdin")
        import zoo
        outs = zoo.load(a.workdir).translate(texts, beam=a.beam, length_penalty=a.length_penalty, max_len=a.max_len)
    except BAD_INPUT as e:
        return error(e)
    for line in outs:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
