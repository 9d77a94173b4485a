"""Fill-mask with a masked-LM run: the top-k tokens and their probabilities at every [MASK].

    zoo-fill-mask runs/mlm --text 'The "wh[MASK]le" statement is used for repeated execution' --top-k 5

The text is framed [CLS] text [SEP]; each literal "[MASK]" in it is one [MASK] token (one byte
with the byte tokenizer). Predictions are over ordinary tokens only (never a special). A text
longer than the model's positions is refused rather than cut, since a cut could drop the mask.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from zoo.cli import BAD_INPUT, error


def encode_checked(ids: list[int], max_len: int, what: str = "--text") -> np.ndarray:
    if len(ids) > max_len:
        raise ValueError(f"{what} is {len(ids)} tokens with [CLS] and [SEP], more than the model's "
                         f"max_len={max_len}; shorten it")
    return np.asarray([ids], np.int32)


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
    logits_1TV = model.apply({"params": params}, jnp.asarray(ids_1T), jnp.zeros_like(ids_1T),
                             jnp.ones(ids_1T.shape, bool))
    probs_MV = np.asarray(jax.nn.softmax(logits_1TV[0, where, sp.ordinary_start:sp.n_ordinary], axis=-1))
    top_MK = np.argsort(-probs_MV, axis=-1)[:, :top_k]
    return [[(sp.ordinary_start + int(i), float(p[i])) for i in row] for row, p in zip(top_MK, probs_MV)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="zoo-fill-mask", description=__doc__.split("\n")[0])
    ap.add_argument("workdir", help="a bert_mlm run directory (train.py --workdir)")
    ap.add_argument("--text", required=True, action="append",
                    help='text with one or more "[MASK]" (repeatable: one block of output per text)')
    ap.add_argument("--top-k", type=int, default=5, help="predictions shown per [MASK] (default: %(default)s)")
    a = ap.parse_args(argv)
    from zoo.tasks.mlm import SPECIALS
    from zoo.train.checkpoint import load_run
    try:
        model, params, tok, _ = load_run(a.workdir, "bert_mlm")
        all_fills = [fill_mask(model, params, tok, text, a.top_k) for text in a.text]
    except BAD_INPUT as e:
        return error(e)
    for text, fills in zip(a.text, all_fills):
        best = iter(tok.decode([row[0][0]]) for row in fills)
        print("".join(piece if i == 0 else next(best) + piece for i, piece in enumerate(text.split(SPECIALS[2]))))
        for m, row in enumerate(fills):
            print(f"[MASK] {m + 1}: " + "  ".join(f"{tok.decode([i])!r} {p:.3f}" for i, p in row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
