"""A masked-LM run (task bert_mlm) scored on a held-out source: its pseudo-accuracy (the share of masked tokens
it predicts), loss and perplexity over them.

The source's documents are read as training reads them (zoo.data.corpus.load_documents), tokenized and joined
by eot, and cut into consecutive [CLS] window [SEP] rows that cover the text once (zoo.tasks.mlm.frame). Each
row is masked as training masks (15% of its ordinary tokens, 80/10/10), from its own fixed seed, so two runs
(and two batch sizes) are compared on the same masks. The last batch is filled with rows that carry no weight.
"""

from __future__ import annotations

import math

import jax
import numpy as np


def evaluate(task, params, tokenizer, data_cfg, *, batch_size: int = 32, max_docs: int | None = None,
             progress=None) -> dict:
    """{documents, tokens, masked, mlm_accuracy, mlm_loss, perplexity} of `task` (a zoo.tasks.mlm.MlmTask)."""
    from zoo.data.corpus import load_documents
    from zoo.errors import ZooDataError
    from zoo.tasks import mlm
    sp = mlm.check_bert_vocab(task.cfg.model, tokenizer)
    docs = load_documents(data_cfg)
    texts = list(docs["text"])[:max_docs]
    eot = tokenizer.eot_token
    tokens = np.asarray([t for ids in tokenizer.encode_batch(list(texts)) for t in ids + [eot]], np.int64)
    T = task.cfg.data.seq_len
    W = T - 2
    n_rows = len(tokens) // W
    if n_rows == 0:
        raise ZooDataError(f"data.source={data_cfg.source!r} holds {len(tokens)} tokens, fewer than one row of "
                           f"{W} (the run's data.seq_len - 2)")
    ids_NT, segments_NT = mlm.frame(tokens[:n_rows * W].reshape(n_rows, W), eot, sp)
    loss = jax.jit(lambda p, b: task.loss(p, b, jax.random.PRNGKey(0), False))
    total, weight, correct = 0.0, 0.0, 0.0
    for start in range(0, n_rows, batch_size):
        idx = np.arange(start, start + batch_size)
        real = idx < n_rows
        idx = np.where(real, idx, start)  # the last batch filled with copies of its first row, weighted 0
        # Each row masked from its own seed: the same masks whatever the batch size.
        rows = [mlm.mask_tokens(np.random.default_rng([mlm.EVAL_SEED, int(i)]), ids_NT[i:i + 1], sp) for i in idx]
        b = {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}
        b["weights"] = b["weights"] * real[:, None]
        b.update(positions=mlm.chosen_positions(b["weights"], mlm.max_predictions(T)), segment_ids=segments_NT[idx],
                 valid=np.ones(b["inputs"].shape, bool))
        s, aux = loss(params, b)
        total, weight, correct = total + float(s), weight + float(aux["weight"]), correct + float(aux["correct"])
        if progress:
            progress(int(real.sum()))
    return {"documents": len(texts), "tokens": int(n_rows * W), "masked": int(weight),
            "mlm_accuracy": correct / weight, "mlm_loss": total / weight, "perplexity": math.exp(total / weight)}
