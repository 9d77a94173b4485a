"""The programs zoo-serve's engine runs (zoo.engine.batching jits them with its model bound; zoo.aot.serve compiles the
same ones for a TPU): new prompts prefilled from their positions on, one or several at once (`prefill`), and a chunk
of decode steps over the first rows (`decode_chunk`), each reading and writing its rows' pages of the pool in place
(zoo.engine.pages, zoo.nn.paged_cache), with the sampling they share (greedy at temperature 0, else top-k / top-p
filtered, one key per row and step).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from zoo.infer.grammar import words
from zoo.nn import multi_lora, paged_cache
from zoo.nn.layers import first_argmax


def _apply(model, adapters, variables, ids_BT, **kw):
    """model.apply, with each row's LoRA adapter added where `adapters` is (tables, index_B) (zoo.nn.multi_lora;
    zoo-serve --adapter), the base alone where it is None."""
    if adapters is None:
        return model.apply(variables, ids_BT, **kw)
    with multi_lora.intercept(*adapters):
        return model.apply(variables, ids_BT, **kw)


def key_data(seed: int, choice: int) -> np.ndarray:
    """The key data of completion `choice` of a request with `seed`: its tokens are a function of both alone."""
    return np.asarray(jax.random.fold_in(jax.random.PRNGKey(seed), choice), np.uint32)


def _filtered(logits_V, top_k, top_p):
    """logits_V with what top-k (0: off) and top-p (1: off) leave out at -inf (one row; a sort of the vocabulary)."""
    V = logits_V.shape[0]
    sorted_V = jnp.sort(logits_V)[::-1]
    kth = sorted_V[jnp.clip(top_k - 1, 0, V - 1)]
    keep_k = top_k <= 0
    logits_V = jnp.where(keep_k | (logits_V >= kth), logits_V, -jnp.inf)
    sorted_V = jnp.where(keep_k | (sorted_V >= kth), sorted_V, -jnp.inf)
    probs_V = jax.nn.softmax(sorted_V)
    before_V = jnp.cumsum(probs_V) - probs_V  # a token stays if the mass before it is < top_p
    cutoff = jnp.min(jnp.where(before_V < top_p, sorted_V, jnp.inf))
    return jnp.where((top_p >= 1.0) | (logits_V >= cutoff), logits_V, -jnp.inf)


def masked(logits_BV, mask_BW):
    """logits_BV with the tokens a row's bitmask leaves out at -inf (mask_BW [B, ceil(V / 32)] int32, bit v % 32 of
    word v // 32 set: token v allowed; zoo.infer.grammar). A batch whose words are all -1 (no row has a grammar)
    skips the unpacking."""
    def apply(logits_BV):
        v_V = jnp.arange(logits_BV.shape[1])
        bits_BV = (mask_BW[:, v_V // 32] >> (v_V % 32)) & 1
        return jnp.where(bits_BV == 1, logits_BV, -jnp.inf)
    return jax.lax.cond(jnp.all(mask_BW == -1), lambda x: x, apply, logits_BV)


def _sample(logits_BV, keys, temp_B, topk_B, topp_B, mask_BW):
    """One token per row: greedy at temperature 0, else sampling at its temperature, filtered by its top-k and
    top-p (the sorting only when some row asks for a filter), among the tokens its grammar's bitmask allows."""
    logits_BV = masked(logits_BV, mask_BW)
    greedy_B = first_argmax(logits_BV)

    def sampled(logits_BV):  # only when some row samples: its Gumbel noise and arg-max over [B, V] cost as much
        scaled_BV = logits_BV / jnp.maximum(temp_B, 1e-6)[:, None]  # as the rest of a 32-row step's sampling
        need = jnp.any((topk_B > 0) | (topp_B < 1.0))
        scaled_BV = jax.lax.cond(need, lambda x: jax.vmap(_filtered)(x, topk_B, topp_B), lambda x: x, scaled_BV)
        return jnp.where(temp_B == 0, greedy_B, jax.vmap(jax.random.categorical)(keys, scaled_BV).astype(jnp.int32))
    return jax.lax.cond(jnp.any(temp_B > 0), sampled, lambda x: greedy_B, logits_BV)


def prefill(model, params, cache, table_RN, logits_BV, rows_R, ids_RP, lengths_R, starts_R, own_from_R,
            adapters=None, *, kernel=None):
    """R prompts at once (R = 1: a prompt alone, a long prompt's piece), each from its position starts_R on into
    its pages: ids_RP right-padded to a bucket P, lengths_R their real lengths, table_RN each one's first N pages
    (zoo.engine.pages; a padding prompt's: the scratch page). Each token's keys and values are written into its
    page in place and each query attends over its row's first N * PAGE slots (zoo.nn.paged_cache, as a decode
    step): the slots before its start hold the prompt's first tokens already (a stored prefix's pages, an earlier
    piece). A row's positions before own_from_R are read, not written (a piece moved back to fit the window
    computes again tokens whose pages other rows may share). Each one's last real token's logits go into
    logits_BV at its row (rows_R; a row index past the cache's rows is padding, written nowhere). One program over
    R rows: its products R x P rows deep (a short prompt's prefill alone is a product of a few dozen rows, which
    XLA:CPU runs at a fraction of its rate). `model`: the decoder, the engine's jitted program with it bound;
    `kernel`: the pool is laid out for that paged-attention kernel (zoo.nn.paged_kernels), read here by the gather."""
    P = ids_RP.shape[1]
    pos_RP = jnp.where(jnp.arange(P)[None, :] < lengths_R[:, None], starts_R[:, None] + jnp.arange(P)[None, :], -1)
    with paged_cache.paged(table_RN, own_from_R, kernel):
        out, upd = _apply(model, adapters, {"params": params, "cache": cache}, ids_RP, decode=True,
                          positions_BT=pos_RP, logits_at_B=jnp.maximum(lengths_R - 1, 0), mutable=["cache"])
    return upd["cache"], logits_BV.at[rows_R].set(out[:, 0].astype(jnp.float32), mode="drop")


def first_tokens(vocab: int, logits_BV, rows_R, keys_R2, temp_R, topk_R, topp_R):
    """The first token of each new row (rows_R: rows whose prompts are in), sampled from its prefill's logits as
    decode_chunk's first step samples (its key at step 0, its temperature, top-k and top-p; no grammar), so it goes
    out before the next decode call; that call feeds it (decode_chunk's `forced_B`)."""
    R = rows_R.shape[0]
    keys = jax.vmap(jax.random.fold_in)(keys_R2, jnp.zeros(R, jnp.int32))
    mask_RW = jnp.full((R, words(vocab)), -1, jnp.int32)  # no grammar: every token allowed
    return _sample(logits_BV[rows_R][:, :vocab], keys, temp_R, topk_R, topp_R, mask_RW)


def decode_chunk(model, vocab: int, ax: int, params, cache, table_BN, logits_BV, positions_B, temp_B, topk_B, topp_B,
                 keys_B2, steps_B, mask_BW, n=None, adapters=None, forced_B=None, *, B: int, K: int, L: int,
                 kernel=None):
    """n steps (at most K; None: K) of the first B rows (a bucket holding every active row): sample from each row's
    logits, feed the token back at its position. One program runs a chunk or a single step (a new row's first
    token, a streaming row): n is traced, K is not. The rows' first L slots (a length bucket holding every
    position the steps write; table_BN their first ceil(L / PAGE) pages, zoo.engine.pages) are all the steps read:
    attention over L keys, not the window, and only the pages the steps wrote go back into the pool. Returns the
    pool and logits with those rows updated, and the tokens [B, K] (the first n
    columns sampled; rows free within B, position -1, compute nothing anyone reads). `vocab`: the tokenizer's, the
    ids sampled from (a model may pad its output). mask_BW: each row's allowed tokens (zoo.infer.grammar's bitmask,
    all -1 for a row without a grammar), applied at every step: a batch with a grammar row runs one step (n = 1), its
    matcher advanced on the host before the next. `adapters` (every program's): None, or (tables, index_B) giving
    each row its LoRA adapter (zoo.nn.multi_lora). `forced_B`: each row's first token where it was sampled already
    (`first_tokens`; -1: sample it here), fed at the first step in place of sampling it. `kernel`: each step's
    attention by that paged-attention kernel over the pool laid out for it (zoo.nn.paged_kernels), None: the
    pages gathered."""
    full_logits, logits_BV = logits_BV, logits_BV[:B]

    def step(i, carry):
        pool, logits_BV, pos_B, toks_KB = carry
        keys = jax.vmap(jax.random.fold_in)(keys_B2, steps_B + i)
        tok_B = _sample(logits_BV[:, :vocab], keys, temp_B, topk_B, topp_B, mask_BW)
        if forced_B is not None:
            tok_B = jnp.where((i == 0) & (forced_B >= 0), forced_B, tok_B)
        # each layer writes its token into its page and reads the rows' pages (or attends by `kernel`)
        with paged_cache.paged(table_BN, kernel=kernel):
            out, upd = _apply(model, adapters, {"params": params, "cache": pool}, tok_B[:, None], decode=True,
                              positions_BT=pos_B[:, None], mutable=["cache"])
        return (upd["cache"], out[:, -1, :].astype(jnp.float32), jnp.where(pos_B >= 0, pos_B + 1, -1),
                toks_KB.at[i].set(tok_B))
    init = (cache, logits_BV, positions_B, jnp.zeros((K, B), jnp.int32))
    cache, logits_BV, _, toks_KB = jax.lax.fori_loop(0, K if n is None else jnp.minimum(n, K), step, init)
    return cache, full_logits.at[:B].set(logits_BV), toks_KB.T
