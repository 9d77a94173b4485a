"""The summed log-likelihood of the scored tail of many token rows, batched and jitted.

A row is a window of token ids and how many of its last tokens are scored: the model reads ids[:-1] and
each scored token is predicted from the ids before it in the window. Rows are sorted by length and cut
into batches of at most `batch_size`; each batch is padded to a bucketed shape (rows and length to the
next power of two, zoo.infer.encoder.bucket), so any number of rows compiles a handful of shapes. Padding
goes on the right: a causal model's real positions never see it, and its targets weigh 0.

Log-probabilities come from the fused output projection the trainer's loss uses (zoo.nn.losses: float32,
no [B, T, V] logits), taken per row; each row's sum is float32 on the device and float64 on the host.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from zoo.infer.encoder import batches, bucket
from zoo.models.gpt import output_embedding
from zoo.nn.losses import linear_cross_entropy, token_logprobs


def prefix_token(tokenizer) -> int:
    """The token a document (or an empty context) starts from: the BOS transformers' tokenizer puts before a text
    (`special_prefix`), else the tokenizer's BOS, else end-of-text (as lm-evaluation-harness does)."""
    first = tuple(getattr(tokenizer, "special_prefix", ()))
    bos = first[-1] if first else getattr(tokenizer, "bos_token", None)
    return tokenizer.eot_token if bos is None else bos


@dataclass(frozen=True)
class Row:
    ids: tuple[int, ...]  # the window: the model reads ids[:-1]
    scored: int  # how many of the last ids are scored (1 <= scored < len(ids))


def pad_batch(rows: list[Row], batch_size: int, max_len: int):
    """(inputs_BT, targets_BT, weights_BT) of rows padded to the bucketed shape; extra rows weigh nothing."""
    B = bucket(len(rows), batch_size)
    T = bucket(max(len(r.ids) - 1 for r in rows), max_len, least=8)
    inputs_BT = np.zeros((B, T), np.int32)
    targets_BT = np.zeros((B, T), np.int32)
    weights_BT = np.zeros((B, T), np.float32)
    for i, r in enumerate(rows):
        n = len(r.ids) - 1
        inputs_BT[i, :n] = r.ids[:-1]
        targets_BT[i, :n] = r.ids[1:]
        weights_BT[i, n - r.scored:n] = 1.0
    return inputs_BT, targets_BT, weights_BT


@functools.partial(jax.jit, static_argnames=("model",))
def _row_loglik(params, inputs_BT, targets_BT, weights_BT, *, model):
    """float32[B]: each row's summed log-likelihood of its weighted targets."""
    h_BTD = model.apply({"params": params}, inputs_BT, hidden=True)
    w_VD = output_embedding(model.cfg, params)

    def one(h_TD, t_T, w_T):  # the fused loss sums over its batch; one row at a time keeps the rows apart
        return linear_cross_entropy(h_TD[None], w_VD, t_T[None], w_T[None], logit_cap=model.cfg.final_softcap)[0]
    return -jax.vmap(one)(h_BTD, targets_BT, weights_BT)


def score_rows(model, params, rows: list[Row], *, batch_size: int = 8, max_len: int | None = None,
               progress=None) -> np.ndarray:
    """float64[len(rows)]: the summed log-likelihood of each row's scored tokens, in the order given.
    `max_len` caps the padded length (default: the model's positions); `progress(n)` is called after each
    batch with the number of rows it held."""
    for r in rows:
        if not 1 <= r.scored < len(r.ids):
            raise ValueError(f"a row of {len(r.ids)} ids cannot score its last {r.scored}")
    cap = max_len or model.cfg.max_len
    out = np.zeros(len(rows), np.float64)
    for idx in batches([len(r.ids) for r in rows], batch_size):
        arrays = pad_batch([rows[i] for i in idx], batch_size, cap)
        sums_B = np.asarray(_row_loglik(params, *map(jnp.asarray, arrays), model=model), np.float64)
        out[idx] = sums_B[:len(idx)]
        if progress is not None:
            progress(len(idx))
    return out


@functools.partial(jax.jit, static_argnames=("model",))
def _row_token_logprobs(params, inputs_BT, targets_BT, *, model):
    """float32[B, T]: log p of each target given the ids before it in its row."""
    h_BTD = model.apply({"params": params}, inputs_BT, hidden=True)
    return token_logprobs(h_BTD, output_embedding(model.cfg, params), targets_BT, logit_cap=model.cfg.final_softcap)


def score_tokens(model, params, rows: list[Row], *, batch_size: int = 8, max_len: int | None = None,
                 progress=None) -> list[np.ndarray]:
    """float32[row.scored] per row: the log-probability of each scored token, in the order given (batched and
    bucketed as score_rows; their sums equal its sums to float32 rounding)."""
    for r in rows:
        if not 1 <= r.scored < len(r.ids):
            raise ValueError(f"a row of {len(r.ids)} ids cannot score its last {r.scored}")
    cap = max_len or model.cfg.max_len
    out: list = [None] * len(rows)
    for idx in batches([len(r.ids) for r in rows], batch_size):
        inputs_BT, targets_BT, _ = pad_batch([rows[i] for i in idx], batch_size, cap)
        lp_BT = np.asarray(_row_token_logprobs(params, jnp.asarray(inputs_BT), jnp.asarray(targets_BT), model=model))
        for b, i in enumerate(idx):
            n = len(rows[i].ids) - 1
            out[i] = lp_BT[b, n - rows[i].scored:n]
        if progress is not None:
            progress(len(idx))
    return out
