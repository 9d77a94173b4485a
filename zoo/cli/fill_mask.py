"""Fill-mask with a masked-LM run: the top-k tokens and their probabilities at every [MASK].

    zoo-fill-mask runs/mlm --text 'The "wh[MASK]le" statement is used for repeated execution' --top-k 5
    zoo-fill-mask runs/mlm --file masked.txt --out fills.jsonl   # one text a line (or .jsonl {"text": ...})

The text is framed [CLS] text [SEP]; each literal "[MASK]" in it (the tokenizer's own mask text: a
converted RoBERTa's "<mask>") is one mask token (one byte with the byte tokenizer). Probabilities are the
softmax over the whole vocabulary, specials included, as transformers' fill-mask pipeline gives them. A
text longer than the model's positions is refused rather than cut, since a cut could drop the mask.

A shell over zoo.load(...) and zoo.api.encoder (Pretrained.fill_mask): the texts run in jitted batches of
--batch-size (zoo.infer.encoder). With --file (zoo.cli.inputs) each gives one JSON line: {"text": ...,
"filled": the text with each [MASK] replaced by its best token, "masks": [[{"token": ..., "id": ..., "prob": ...}, ...top-k], ...one list per [MASK]]}.
"""

from __future__ import annotations

import argparse
import sys

from zoo.api import encoder
from zoo import runtime
from zoo.cli import BAD_INPUT, error


def main(argv=None) -> int:
    runtime.prepare_command()  # the compilation cache, XLA's log level: before jax starts
    ap = argparse.ArgumentParser(prog="zoo-fill-mask", description=__doc__.split("\n")[0])
    ap.add_argument("workdir", help="a bert_mlm run directory (train.py --workdir)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", action="append",
                     help='text with one or more "[MASK]" (repeatable: one block of output per text)')
    src.add_argument("--file", default=None, metavar="PATH",
                     help='texts with [MASK]s: .txt (one a line) or .jsonl ({"text": ...} a line); prints JSON lines')
    ap.add_argument("--top-k", type=int, default=5, help="predictions shown per [MASK] (default: %(default)s)")
    ap.add_argument("--batch-size", type=int, default=32, metavar="N",
                    help="texts per batch with --file (default: %(default)s)")
    ap.add_argument("--out", default=None, metavar="PATH", help="write the output to this file (default: stdout)")
    a = ap.parse_args(argv)
    from zoo.cli import inputs
    try:
        if a.batch_size < 1:
            raise ValueError(f"--batch-size={a.batch_size} must be >= 1")
        if a.top_k < 1:
            raise ValueError(f"--top-k={a.top_k} must be >= 1")
        lines = inputs.read_lines(a.file) if a.file is not None else [inputs.Line("--text", t) for t in a.text]
        inputs.check_out(a.out)
        import zoo
        lm = zoo.load(a.workdir)
        encoder.require(lm, "bert_mlm", "fill_mask")
        all_fills = encoder.fill_mask_ids(lm, [line.text for line in lines], a.top_k, batch_size=a.batch_size,
                                          where=lambda i: lines[i].where)
    except BAD_INPUT as e:
        return error(e)
    tok = lm.tokenizer
    text_of = encoder.token_text(tok)
    if a.file is not None:
        inputs.write(a.out, inputs.jsonl(
            {"text": line.text, "filled": encoder.filled(line.text, fills, tok),
             "masks": [[{"token": text_of(i), "id": i, "prob": p} for i, p in row] for row in fills]}
            for line, fills in zip(lines, all_fills)))
        return 0
    out = []
    for text, fills in zip(a.text, all_fills):
        out.append(encoder.filled(text, fills, tok))
        for m, row in enumerate(fills):
            out.append(f"[MASK] {m + 1}: " + "  ".join(f"{text_of(i)!r} {p:.3f}" for i, p in row))
    inputs.write(a.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
