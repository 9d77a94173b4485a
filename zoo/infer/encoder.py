"""Batched, jitted inference on a BERT encoder (zoo.models.bert): class probabilities of a classifier, the
top-k tokens at each [MASK] of a masked LM and the best tag at each token of a token classifier, for many
framed rows at once (zoo-classify, zoo-fill-mask --file, Pretrained.tag).

Rows are token ids already framed ([CLS] a [SEP] (b [SEP])) by the caller. They are sorted by length
and cut into batches of at most `batch_size`, so a batch pads little; each batch is padded to a bucketed
shape (the rows to the next power of two, capped at batch_size; the length to the next eighth of a power of
two, `length_bucket`, capped at the model's max_len), so a file of any size compiles at most 20 lengths for
each row count; a batch is cut early where a row is half its longest (`length_batches`). Padded positions are
[PAD] with valid_BT False: the model masks them as keys, so no real position (and no [CLS]) sees them; padded
rows repeat a real row and are dropped. Results come back in the order of the rows given.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


# XLA:CPU's YNNPACK fusions off: its GEMMs left one of this 2-core CPU's two threads idle much of the time on a BERT
# forward. Measured 2026-11-30, all-MiniLM-L6-v2's pooled forward, jax 0.10.2, median of 3 in one process: [rows,
# length] [32, 256] 1,757 -> 1,519 ms, [256, 32] 1,476 -> 1,014 ms, [64, 128] 1,832 -> 1,657 ms (torch: 1,501 and
# 1,277 ms). Training steps run faster with them (gpt_train 2,720 against 2,472 tokens/s), so only the encoder's
# inference programs here and Pretrained.embed's compile without them.
NO_YNN = {"xla_cpu_experimental_ynn_fusion_type": ""}


@functools.cache
def compiler_options() -> dict | None:
    """What the encoder's inference programs compile with: NO_YNN on a CPU whose XLA knows the option, else
    XLA's defaults (None)."""
    if jax.default_backend() != "cpu":
        return None
    try:
        jax.jit(lambda x: x + 1, compiler_options=NO_YNN).lower(np.float32(0)).compile()
    except Exception:  # a jaxlib without the option (it is experimental): the defaults
        return None
    return NO_YNN


def jitted(fn, **jit_kw):
    """`fn` jitted with compiler_options(), on its first call (when the backend is known, not at import)."""
    compiled = []

    @functools.wraps(fn)
    def call(*args, **kw):
        if not compiled:
            compiled.append(jax.jit(fn, compiler_options=compiler_options(), **jit_kw))
        return compiled[0](*args, **kw)
    return call


def bucket(n: int, cap: int, least: int = 1) -> int:
    """The padded size for n: the next power of two >= max(n, least), capped at `cap`."""
    return min(cap, 1 << (max(n, least) - 1).bit_length())


def length_bucket(n: int, cap: int) -> int:
    """The padded length for n tokens: the next multiple of an eighth of the power of two at or above n (at least
    8), capped at `cap`: fewer than max(8, n / 4) padded positions (19 -> 24, 43 -> 48, 75 -> 80, 200 -> 224),
    and lengths up to 512 compile at most 20 shapes. Powers of two alone padded 19 tokens to 32 and 43 to 64:
    sentence-transformers pads a batch to its longest text, and all-MiniLM-L6-v2 on pydoc sentences in batches
    of 256 spent 1.1x its tokens on padding."""
    step = max(8, (1 << (max(n, 1) - 1).bit_length()) // 8)
    return min(cap, -(-max(n, 1) // step) * step)


def batches(lengths: list[int], batch_size: int) -> list[np.ndarray]:
    """Row indices in batches of at most batch_size, longest rows first (ties in row order)."""
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    order = np.argsort(-np.asarray(lengths, np.int64), kind="stable")
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def length_batches(lengths: list[int], batch_size: int, least: int = 8) -> list[np.ndarray]:
    """`batches`, with a batch cut early where a row is half its batch's longest or shorter (lengths under `least`
    counted as `least`, the shortest padded length): one long text no longer pads batch_size - 1 short ones to its
    length. At most one extra batch per halving of the length (a handful on any corpus), each of rows bucketed as
    usual; sentence-transformers pads whole batches to their longest text."""
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    order = np.argsort(-np.asarray(lengths, np.int64), kind="stable")
    out, start = [], 0
    for i, row in enumerate(order):
        if i > start and (i - start == batch_size or 2 * max(lengths[row], least) <= lengths[order[start]]):
            out.append(order[start:i])
            start = i
    if start < len(order):
        out.append(order[start:])
    return out


def pad_rows(rows: list[list[int]], seg_starts: list[int], pad_id: int, batch_size: int, max_len: int):
    """(ids_BT, segment_ids_BT, valid_BT) of rows padded to the bucketed shape; extra rows repeat row 0."""
    B = bucket(len(rows), batch_size)
    T = length_bucket(max(map(len, rows)), max_len)
    rows = rows + [rows[0]] * (B - len(rows))
    seg_starts = list(seg_starts) + [seg_starts[0]] * (B - len(seg_starts))
    ids_BT = np.full((B, T), pad_id, np.int32)
    lengths_B = np.asarray([len(r) for r in rows])
    for i, r in enumerate(rows):
        ids_BT[i, :len(r)] = r
    pos_1T = np.arange(T)[None]
    valid_BT = pos_1T < lengths_B[:, None]
    segment_ids_BT = ((pos_1T >= np.asarray(seg_starts)[:, None]) & valid_BT).astype(np.int32)
    return ids_BT, segment_ids_BT, valid_BT


@functools.partial(jitted, static_argnames=("model", "softmax"))
def _class_probs(params, ids_BT, segment_ids_BT, valid_BT, *, model, softmax: bool = True):
    logits_BC = model.apply({"params": params}, ids_BT, segment_ids_BT, valid_BT).astype(jnp.float32)
    return jax.nn.softmax(logits_BC, axis=-1) if softmax else logits_BC


def class_probs(model, params, rows: list[list[int]], seg_starts: list[int], *, pad_id: int,
                batch_size: int = 32, softmax: bool = True) -> np.ndarray:
    """probs [N, C] of a BertClassifier for N framed rows (its logits with softmax=False); segment 1 of row i
    starts at seg_starts[i]."""
    out = [None] * len(rows)
    for idx in length_batches([len(r) for r in rows], batch_size):
        arrays = pad_rows([rows[i] for i in idx], [seg_starts[i] for i in idx], pad_id, batch_size,
                          model.cfg.max_len)
        probs_BC = np.asarray(_class_probs(params, *map(jnp.asarray, arrays), model=model, softmax=softmax))
        for b, i in enumerate(idx):
            out[i] = probs_BC[b]
    return np.stack(out)


@functools.partial(jitted, static_argnames=("model", "top_k"))
def _mask_top_k(params, ids_BT, valid_BT, positions_BK, *, model, top_k: int):
    # Only the K gathered positions go through the MLM head: [B, K, V], never [B, T, V].
    logits_BKV = model.apply({"params": params}, ids_BT, jnp.zeros_like(ids_BT), valid_BT, positions_BK=positions_BK)
    return jax.lax.top_k(jax.nn.softmax(logits_BKV.astype(jnp.float32), axis=-1), top_k)


def mask_top_k(model, params, rows: list[list[int]], *, pad_id: int, mask_id: int, top_k: int,
               batch_size: int = 32) -> list[list[list[tuple[int, float]]]]:
    """For each framed row, for each [MASK] in it: the top_k (token id, probability) pairs, most likely first.
    As transformers' fill-mask pipeline: the softmax over the whole vocabulary, specials included."""
    top_k = min(top_k, model.cfg.vocab_size)
    where = [np.flatnonzero(np.asarray(r) == mask_id) for r in rows]
    out = [None] * len(rows)
    for idx in length_batches([len(r) for r in rows], batch_size):
        ids_BT, _, valid_BT = pad_rows([rows[i] for i in idx], [len(rows[i]) for i in idx], pad_id, batch_size,
                                       model.cfg.max_len)
        K = bucket(max(len(where[i]) for i in idx), ids_BT.shape[1])
        positions_BK = np.zeros((ids_BT.shape[0], K), np.int32)  # extra slots read [CLS]; their results are dropped
        for b, i in enumerate(idx):
            positions_BK[b, :len(where[i])] = where[i]
        probs_BKk, ids_BKk = (np.asarray(x) for x in _mask_top_k(
            params, jnp.asarray(ids_BT), jnp.asarray(valid_BT), jnp.asarray(positions_BK), model=model, top_k=top_k))
        for b, i in enumerate(idx):
            out[i] = [[(int(t), float(p)) for t, p in zip(ids_BKk[b, m], probs_BKk[b, m])]
                      for m in range(len(where[i]))]
    return out


@functools.partial(jitted, static_argnames=("model",))
def _best_tags(params, ids_BT, valid_BT, *, model):
    return jnp.argmax(model.apply({"params": params}, ids_BT, jnp.zeros_like(ids_BT), valid_BT), axis=-1)


def best_tags(model, params, rows: list[list[int]], *, pad_id: int, batch_size: int = 32) -> list[np.ndarray]:
    """For each framed row, a token classifier's most likely tag id at each of its positions."""
    out = [None] * len(rows)
    for idx in length_batches([len(r) for r in rows], batch_size):
        ids_BT, _, valid_BT = pad_rows([rows[i] for i in idx], [len(rows[i]) for i in idx], pad_id, batch_size,
                                       model.cfg.max_len)
        best_BT = np.asarray(_best_tags(params, jnp.asarray(ids_BT), jnp.asarray(valid_BT), model=model))
        for b, i in enumerate(idx):
            out[i] = best_BT[b, :len(rows[i])]
    return out
