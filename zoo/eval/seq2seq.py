"""An encoder-decoder run scored on a source/target file: corpus BLEU (sacrebleu, 13a) and exact match of its
greedy or beam outputs against the targets as written.

Pairs are read as training reads them (zoo.tasks.seq2seq_data.load_pairs: data.source_column /
target_column, "a.b" for a key of a dict column, builtin for the offline word-reversal task). A source longer
than the run's data.seq_len is cut as training cuts it, and counted. Rows are decoded in batches of a fixed
size, the last one filled, and the source length padded to a few buckets (padded_length), so a file compiles
a few shapes, not one per row.
"""

from __future__ import annotations

import numpy as np


def evaluate(model, params, tokenizer, run_cfg, data_cfg, *, beam: int = 1, batch_size: int = 32,
             max_rows: int | None = None, length_penalty: float | None = None, progress=None, worst: int = 5) -> dict:
    """{examples, bleu, exact_match, beam, truncated, worst} of the run on `data_cfg`'s pairs."""
    from zoo.infer import decoding
    from zoo.infer.bleu import corpus_scores
    from zoo.tasks.seq2seq_data import check_framing, encode_pairs, load_pairs, padded_length
    decoding.check_beam(beam)
    sp = check_framing(run_cfg.model, tokenizer)
    sources, targets = load_pairs(data_cfg, tokenizer)
    if max_rows is not None:
        sources, targets = sources[:max_rows], targets[:max_rows]
    seq_len = run_cfg.data.seq_len
    pairs, truncated, _ = encode_pairs(tokenizer, sp, sources, targets, seq_len)
    lengths = pairs.src.lengths
    hyps = []
    for start in range(0, len(sources), batch_size):
        idx = np.arange(start, min(start + batch_size, len(sources)))
        fill = np.concatenate([idx, np.full(batch_size - len(idx), idx[0])])  # one batch shape throughout
        S = padded_length(int(lengths[fill].max()), seq_len)
        src_BS = pairs.src.padded(fill, S, 0)
        out = decoding.generate(model, params, src_BS, np.arange(S)[None] < lengths[fill][:, None], max_len=seq_len,
                                bos_id=sp.decoder_start, eos_id=sp.eos, vocab_limit=tokenizer.n_vocab, beam=beam,
                                length_penalty=sp.length_penalty if length_penalty is None else length_penalty,
                                style=sp.beam_style, early_stopping=sp.early_stopping)
        hyps += [tokenizer.decode(ids) for ids in out[:len(idx)]]
        if progress:
            progress(len(idx))
    refs = [t.strip() for t in targets]
    hyps = [h.strip() for h in hyps]
    scores = corpus_scores(hyps, refs)
    rows = [{"source": s, "target": r, "output": h, "chrf": _chrf(h, r)} for s, r, h in zip(sources, refs, hyps)]
    rows = sorted((r for r in rows if r["output"] != r["target"]), key=lambda r: r["chrf"])[:worst]
    return {"examples": len(sources), **scores, "beam": beam, "truncated": int(truncated), "worst": rows}


def _chrf(hyp: str, ref: str) -> float:
    import sacrebleu
    return sacrebleu.sentence_chrf(hyp, [ref]).score
