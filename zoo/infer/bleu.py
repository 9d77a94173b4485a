"""Translation quality as an evaluator: decode batches, score corpus BLEU (sacrebleu, its default 13a
tokenization) and exact match against their targets.

The seq2seq task runs `evaluate` after each evaluation (Task.evaluate_extra). References are the
targets' tokens decoded back to text (a cut target is scored as cut).
"""

from __future__ import annotations

import jax
import numpy as np
import sacrebleu

from zoo.infer import decoding


def corpus_scores(hypotheses: list[str], references: list[str]) -> dict:
    """{'bleu': corpus BLEU in [0, 100], 'exact_match': share of hypotheses equal to their reference}."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    bleu = sacrebleu.corpus_bleu(hypotheses, [references]).score if hypotheses else 0.0
    exact = float(np.mean([h == r for h, r in zip(hypotheses, references)])) if hypotheses else 0.0
    return {"bleu": bleu, "exact_match": exact}


def translate_batches(model, params, batches, tokenizer, sp, max_len: int, beam: int = 1,
                      length_penalty: float = 0.6) -> tuple[list[str], list[str]]:
    """(hypotheses, references) over the rows of `batches` that carry weight (fill rows skipped)."""
    hyps, refs = [], []
    for b in batches:
        keep = np.asarray(b["weights"]).sum(1) > 0
        out = decoding.generate(model, params, b["src"][keep], b["src_valid"][keep], max_len=max_len,
                                bos_id=sp.bos, eos_id=sp.eos, vocab_limit=tokenizer.n_vocab, beam=beam,
                                length_penalty=length_penalty)
        hyps += [tokenizer.decode(ids) for ids in out]
        for row, w in zip(b["tgt_out"][keep], b["weights"][keep]):
            ids = [int(t) for t, on in zip(row, w) if on and t != sp.eos]
            refs.append(tokenizer.decode(ids))
    return hyps, refs


def evaluate(model, params, batches, tokenizer, sp, max_len: int, beam: int = 1) -> dict:
    """{'eval_bleu', 'eval_exact_match'} of decoding `batches` (a run's validation batches); `sp` holds the
    run's special ids (bos, eos)."""
    if any(len(x.sharding.device_set) > 1 for x in jax.tree.leaves(params)):
        # Decoding runs on one device: gather params sharded over a mesh once.
        params = jax.device_put(jax.device_get(params), jax.local_devices()[0])
    hyps, refs = translate_batches(model, params, batches, tokenizer, sp, max_len, beam)
    return {f"eval_{k}": v for k, v in corpus_scores(hyps, refs).items()}
