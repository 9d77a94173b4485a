"""Fill-mask with a masked-LM run: the top-k tokens and their probabilities at every [MASK].

    zoo-fill-mask runs/mlm --text 'The "wh[MASK]le" statement is used for repeated execution' --top-k 5
    zoo-fill-mask runs/mlm --file masked.txt --out fills.jsonl   # one text a line (or .jsonl {"text": ...})

The text is framed [CLS] text [SEP]; each literal "[MASK]" in it is one [MASK] token (one byte
with the byte tokenizer). Predictions are over ordinary tokens only (never a special). A text
longer than the model's positions is refused rather than cut, since a cut could drop the mask.

With --file (zoo.cli.inputs) the texts run in jitted batches of --batch-size (zoo.infer.encoder) and
each gives one JSON line: {"text": ..., "filled": the text with each [MASK] replaced by its best token,
"masks": [[{"token": ..., "id": ..., "prob": ...}, ...top-k], ...one list per [MASK]]}.
"""

from __future__ import annotations

import argparse
import functools
import sys

import numpy as np

from zoo.cli import BAD_INPUT, error


def check_length(ids: list[int], max_len: int, what: str = "--text") -> list[int]:
    if len(ids) > max_len:
        raise ValueError(f"{what} is {len(ids)} tokens with [CLS] and [SEP], more than the model's "
                         f"max_len={max_len}; shorten it")
    return ids


def encode_checked(ids: list[int], max_len: int, what: str = "--text") -> np.ndarray:
    return np.asarray([check_length(ids, max_len, what)], np.int32)


@functools.cache
def jitted_apply(model):
    """model.apply({"params": p}, *inputs) compiled as one program (op by op, a BERT compiles some 250 small
    ones); one per model, kept."""
    import jax
    return jax.jit(lambda params, *inputs: model.apply({"params": params}, *inputs))


def fill_mask(model, params, tokenizer, text: str, top_k: int = 5) -> list[list[tuple[int, float]]]:
    """For each [MASK] in `text`, the top_k (token id, probability) pairs, most likely first."""
    import jax
    import jax.numpy as jnp
    from zoo.tasks import mlm
    if not text.strip():
        raise ValueError("--text is empty")
    if top_k < 1:
        raise ValueError(f"--top-k={top_k} must be >= 1")
    sp = mlm.bert_specials(tokenizer)
    ids_1T = encode_checked(mlm.encode_masked(text, tokenizer, sp), model.cfg.max_len)
    where = np.flatnonzero(ids_1T[0] == sp.mask)
    if not len(where):
        raise ValueError(f"--text has no {mlm.SPECIALS[2]}; put one where a token should be predicted")
    logits_1TV = jitted_apply(model)(params, jnp.asarray(ids_1T), jnp.zeros_like(ids_1T),
                                     jnp.ones(ids_1T.shape, bool))
    probs_MV = np.asarray(jax.nn.softmax(logits_1TV[0, where, sp.ordinary_start:sp.n_ordinary], axis=-1))
    top_MK = np.argsort(-probs_MV, axis=-1)[:, :top_k]
    return [[(sp.ordinary_start + int(i), float(p[i])) for i in row] for row, p in zip(top_MK, probs_MV)]


def fill_mask_lines(model, params, tokenizer, lines, top_k: int = 5, batch_size: int = 32):
    """fill_mask for every line of a file (zoo.cli.inputs.Line), batched; errors name the line."""
    from zoo.infer.encoder import mask_top_k
    from zoo.tasks import mlm
    if top_k < 1:
        raise ValueError(f"--top-k={top_k} must be >= 1")
    sp = mlm.bert_specials(tokenizer)
    rows = []
    for line in lines:
        ids = check_length(mlm.encode_masked(line.text, tokenizer, sp), model.cfg.max_len, line.where)
        if sp.mask not in ids:
            raise ValueError(f"{line.where} has no {mlm.SPECIALS[2]}; put one where a token should be predicted")
        rows.append(ids)
    return mask_top_k(model, params, rows, pad_id=sp.pad, mask_id=sp.mask, start=sp.ordinary_start,
                      stop=sp.n_ordinary, top_k=top_k, batch_size=batch_size)


def filled(text: str, fills: list[list[tuple[int, float]]], tokenizer) -> str:
    """`text` with each [MASK] replaced by its most likely token."""
    from zoo.tasks.mlm import SPECIALS
    best = iter(tokenizer.decode([row[0][0]]) for row in fills)
    return "".join(piece if i == 0 else next(best) + piece for i, piece in enumerate(text.split(SPECIALS[2])))


def main(argv=None) -> int:
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
    from zoo.train.runs import load_run
    try:
        if a.batch_size < 1:
            raise ValueError(f"--batch-size={a.batch_size} must be >= 1")
        lines = inputs.read_lines(a.file) if a.file is not None else None
        inputs.check_out(a.out)
        model, params, tok, _ = load_run(a.workdir, "bert_mlm")
        if lines is not None:
            all_fills = fill_mask_lines(model, params, tok, lines, a.top_k, a.batch_size)
        else:
            all_fills = [fill_mask(model, params, tok, text, a.top_k) for text in a.text]
    except BAD_INPUT as e:
        return error(e)
    if lines is not None:
        inputs.write(a.out, inputs.jsonl(
            {"text": line.text, "filled": filled(line.text, fills, tok),
             "masks": [[{"token": tok.decode([i]), "id": i, "prob": p} for i, p in row] for row in fills]}
            for line, fills in zip(lines, all_fills)))
        return 0
    out = []
    for text, fills in zip(a.text, all_fills):
        out.append(filled(text, fills, tok))
        for m, row in enumerate(fills):
            out.append(f"[MASK] {m + 1}: " + "  ".join(f"{tok.decode([i])!r} {p:.3f}" for i, p in row))
    inputs.write(a.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
