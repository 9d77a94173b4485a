"""Greedy and beam-search decoding for zoo.models.encdec, with a KV cache, jitted once per shape.

The encoder runs once per input. One decoder call over a dummy [B, max_len] target creates the
cache: zero self-attention keys/values of length max_len and the cross-attention keys/values of the
encoder output (projected once; that call's logits are unused, so XLA drops the rest of it). Then
one token per step against the cache, all inside one `jax.lax.while_loop`: a (batch, source length,
max_len, beam) shape compiles once, not once per token.

Beam search keeps `beam` alive hypotheses and `beam` finished ones per input; a hypothesis whose
EOS ranks among the step's top `beam` candidates finishes, scored log p / ((5 + length) / 6)^alpha
(GNMT length penalty, alpha = length_penalty); the search stops when no alive hypothesis can beat
the worst finished one. With beam 1 and alpha 0 this is exactly greedy decoding. style="hf" ranks
and stops as transformers' `generate` does instead (log p / length^alpha and its `early_stopping`
rule; converted T5 / BART checkpoints decode this way), token for token. Token ids >= vocab_limit
(BOS, PAD, unused embedding rows) are never produced, but their probability counts in every score: the
log-probabilities are normalised over every row, as transformers' are (its suppress_tokens then rules the
same ids out).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from zoo.nn.layers import first_argmax

NEG_INF = -1.0e9  # "impossible" score; finite so that sums and comparisons stay well-defined


def _decode_call(model, params, cache, ids_BT, enc_BSD, src_valid_BS):
    variables = {"params": params} if cache is None else {"params": params, "cache": cache}
    logits_BTV, upd = model.apply(variables, ids_BT, enc_BSD, src_valid_BS, decode=True, method="decode",
                                  mutable=["cache"])
    return upd["cache"], logits_BTV[:, -1]


def _start(model, params, src_BS, src_valid_BS, max_len: int, repeat: int = 1):
    """Encode once, repeat each row `repeat` times (beams), create the cache for max_len target tokens."""
    enc_BSD = model.apply({"params": params}, src_BS, src_valid_BS, method="encode")
    enc_BSD, src_valid_BS = (jnp.repeat(x, repeat, axis=0) for x in (enc_BSD, src_valid_BS))
    dummy_BL = jnp.zeros((enc_BSD.shape[0], max_len), jnp.int32)
    cache, _ = _decode_call(model, params, None, dummy_BL, enc_BSD, src_valid_BS)
    return cache, enc_BSD, src_valid_BS


@functools.partial(jax.jit, static_argnames=("model", "max_len", "vocab_limit"))
def greedy(params, src_BS, src_valid_BS, *, model, max_len: int, bos_id: int, eos_id: int, vocab_limit: int):
    """ids [B, max_len]: the argmax token at each step; EOS from a row's first EOS on."""
    B = src_BS.shape[0]
    cache, enc_BSD, src_valid_BS = _start(model, params, src_BS, src_valid_BS, max_len)

    def cond(c):
        i, _, _, _, done_B = c
        return (i < max_len) & ~jnp.all(done_B)

    def body(c):
        i, cache, tok_B, out_BL, done_B = c
        cache, logits_BV = _decode_call(model, params, cache, tok_B[:, None], enc_BSD, src_valid_BS)
        tok_B = jnp.where(done_B, eos_id, first_argmax(logits_BV[:, :vocab_limit]))
        return i + 1, cache, tok_B, out_BL.at[:, i].set(tok_B), done_B | (tok_B == eos_id)

    init = (jnp.int32(0), cache, jnp.full((B,), bos_id, jnp.int32), jnp.full((B, max_len), eos_id, jnp.int32),
            jnp.zeros((B,), bool))
    return jax.lax.while_loop(cond, body, init)[3]


BEAM_STYLES = ("gnmt", "hf")


def length_penalty_of(length, alpha, style: str = "gnmt"):
    """The divisor of a finished hypothesis' log-probability. gnmt (Wu et al. 2016): ((5 + length) / 6)^alpha;
    hf (transformers): length^alpha. alpha 0 ranks by plain log-probability either way."""
    length = jnp.asarray(length, jnp.float32)
    return ((5.0 + length) / 6.0) ** alpha if style == "gnmt" else length ** alpha


def _reorder(cache, rows, batch_axis: int):
    """Self-attention caches follow their hypothesis to its new slot; cross-attention K/V are equal
    across a row's beams and the index is shared, so they stay."""
    def pick(path, x):
        name = jax.tree_util.keystr(path[-1:])
        return jnp.take(x, rows, axis=batch_axis) if "cached_" in name else x
    return jax.tree_util.tree_map_with_path(pick, cache)


def beam_search(params, src_BS, src_valid_BS, *, model, beam: int, max_len: int, length_penalty: float,
                bos_id: int, eos_id: int, vocab_limit: int, style: str = "gnmt", early_stopping=False):
    """(ids [B, max_len], scores [B]) of the best hypothesis per row.

    style "gnmt": GNMT penalty; a row stops when no alive hypothesis can beat its worst finished one
    (exact: log-probabilities only fall and the penalty is largest at max_len); hypotheses still
    alive at max_len compete too. style "hf": transformers' beam search step for step: penalty
    length^alpha; at max_len the top `beam` candidates all finish; `early_stopping` True stops a
    row once it has `beam` finished, False (its heuristic) once the best alive log-probability over
    the current length^alpha cannot beat the worst finished, "never" the same over max_len^alpha
    (alpha > 0); a stopped row takes no new finished hypotheses. Penalty, ids and stopping rule are
    traced: one compile per (shapes, beam, style).
    """
    check_beam(beam, style, early_stopping)
    return _beam_search(params, src_BS, src_valid_BS, jnp.float32(length_penalty), jnp.int32(bos_id),
                        jnp.int32(eos_id), jnp.asarray(early_stopping is True), jnp.asarray(early_stopping == "never"),
                        model=model, beam=beam, max_len=max_len, vocab_limit=vocab_limit, style=style)


def _hf_still_open(open_B, alive_logp_BK, fin_score_BK, steps, alpha):
    """transformers' early-stop heuristic after a step: a row with K finished stops (for good) once its
    best alive log-probability over steps^alpha cannot beat its worst finished score."""
    best_alive_B = alive_logp_BK[:, 0] / length_penalty_of(steps, alpha, "hf")
    return open_B & ~(_full(fin_score_BK) & (best_alive_B <= fin_score_BK[:, -1]))


def _full(fin_score_BK):
    return jnp.all(fin_score_BK > NEG_INF / 2, axis=1)  # K finished hypotheses


@functools.partial(jax.jit, static_argnames=("model", "beam", "max_len", "vocab_limit", "style"))
def _beam_search(params, src_BS, src_valid_BS, alpha, bos_id, eos_id, stop_when_full, never, *, model, beam: int,
                 max_len: int, vocab_limit: int, style: str):
    B, K, L = src_BS.shape[0], beam, max_len
    hf = style == "hf"
    cache, enc_BSD, src_valid_BS = _start(model, params, src_BS, src_valid_BS, L, repeat=K)
    batch_axis = 1 if model.cfg.scan_layers else 0  # scanned stacks put the layer axis first
    max_penalty = length_penalty_of(L, alpha, style)
    b_B1 = jnp.arange(B)[:, None]

    def cond(c):
        i, _, _, alive_logp_BK, _, fin_score_BK, _, open_B = c
        if hf:
            return (i < L) & jnp.any(open_B) & ~(jnp.all(_full(fin_score_BK)) & stop_when_full)
        # An alive hypothesis' log-prob only falls; its best possible score is at the longest length.
        done_B = _full(fin_score_BK) & (fin_score_BK[:, -1] > alive_logp_BK[:, 0] / max_penalty)
        return (i < L) & ~jnp.all(done_B)

    def body(c):
        i, cache, alive_BKL, alive_logp_BK, fin_BKL, fin_score_BK, last_BK, open_B = c
        cache, logits_NV = _decode_call(model, params, cache, last_BK.reshape(B * K, 1), enc_BSD, src_valid_BS)
        # Normalised over every row, as transformers does, then restricted to the ids the tokenizer writes (its
        # suppress_tokens): over the restricted slice alone, rows with more mass past it would score higher.
        logp_BKV = jax.nn.log_softmax(logits_NV.astype(jnp.float32))[:, :vocab_limit].reshape(B, K, -1)
        V = logp_BKV.shape[-1]
        # 2K candidates: enough that K of them do not end in EOS.
        cand_logp_BC, flat_BC = jax.lax.top_k((alive_logp_BK[..., None] + logp_BKV).reshape(B, K * V), 2 * K)
        origin_BC, tok_BC = flat_BC // V, (flat_BC % V).astype(jnp.int32)
        cand_BCL = alive_BKL[b_B1, origin_BC].at[:, :, i].set(tok_BC)
        # hf: reaching max_len finishes every candidate, as transformers' max-length criterion does.
        ends_BC = (tok_BC == eos_id) | (hf & (i == L - 1))
        # Alive: the K best candidates that did not just end.
        alive_logp_BK, pick_BK = jax.lax.top_k(jnp.where(ends_BC, NEG_INF, cand_logp_BC), K)
        alive_BKL, last_BK = cand_BCL[b_B1, pick_BK], tok_BC[b_B1, pick_BK]
        rows = (b_B1 * K + origin_BC[b_B1, pick_BK]).reshape(-1)
        cache = _reorder(cache, rows, batch_axis)
        # Finished: the K best of the old finished and the candidates that just ended. A candidate
        # finishes only if it ranks among the top K (as in Hugging Face), so beam 1 is greedy; a
        # continuation of a dead (NEG_INF) slot never does. hf: a stopped row, or (early_stopping
        # True) a full one, takes no more.
        live_BC = ends_BC & (jnp.arange(2 * K) < K)[None] & (cand_logp_BC > NEG_INF / 2)
        if hf:
            live_BC = live_BC & (open_B & ~(_full(fin_score_BK) & stop_when_full))[:, None]
        new_score_BC = jnp.where(live_BC, cand_logp_BC / length_penalty_of(i + 1, alpha, style), NEG_INF)
        fin_score_BK, keep_BK = jax.lax.top_k(jnp.concatenate([fin_score_BK, new_score_BC], 1), K)
        fin_BKL = jnp.concatenate([fin_BKL, cand_BCL], 1)[b_B1, keep_BK]
        if hf:  # "never" with alpha > 0 judges the alive at max_len, else at the current length
            steps = jnp.where(never & (alpha > 0), L, i + 1)
            open_B = _hf_still_open(open_B, alive_logp_BK, fin_score_BK, steps, alpha)
        return i + 1, cache, alive_BKL, alive_logp_BK, fin_BKL, fin_score_BK, last_BK, open_B

    seqs_BKL = jnp.full((B, K, L), eos_id, jnp.int32)
    # Only beam 0 is live at the start, so the first step's K candidates are distinct.
    alive_logp_BK = jnp.where(jnp.arange(K)[None] == 0, 0.0, NEG_INF) * jnp.ones((B, 1))
    init = (jnp.int32(0), cache, seqs_BKL, alive_logp_BK, seqs_BKL, jnp.full((B, K), NEG_INF),
            jnp.full((B, K), bos_id, jnp.int32), jnp.ones((B,), bool))
    _, _, alive_BKL, alive_logp_BK, fin_BKL, fin_score_BK, _, _ = jax.lax.while_loop(cond, body, init)
    if hf:  # every row finished at least one hypothesis (max_len finishes them all): the best one wins
        return fin_BKL[:, 0], fin_score_BK[:, 0]
    # Hypotheses still alive compete too, scored at the longest length (as Hugging Face's finalize does):
    # a cut that left no room for EOS must not hand the win to a poor early finisher.
    score_B2K = jnp.concatenate([fin_score_BK, alive_logp_BK / max_penalty], 1)
    best_B = jnp.argmax(score_B2K, 1)
    ids_BL = jnp.concatenate([fin_BKL, alive_BKL], 1)[jnp.arange(B), best_B]
    return ids_BL, score_B2K[jnp.arange(B), best_B]


def check_beam(beam: int, style: str = "gnmt", early_stopping=False) -> None:
    if beam < 1:
        raise ValueError(f"beam size {beam} must be >= 1 (1 is greedy decoding)")
    if style not in BEAM_STYLES:
        raise ValueError(f"beam style {style!r} is unknown; choose one of {', '.join(BEAM_STYLES)}")
    if early_stopping not in (True, False, "never"):
        raise ValueError(f"early_stopping={early_stopping!r}; choose True, False or 'never'")


def generate(model, params, src_BS, src_valid_BS, *, max_len: int, bos_id: int, eos_id: int, vocab_limit: int,
             beam: int = 1, length_penalty: float = 0.6, style: str = "gnmt", early_stopping=False) -> list[list[int]]:
    """Output ids per row, cut before the first EOS. beam 1 is greedy; beam > 1 is beam search, ranked
    and stopped as `style` says (gnmt: zoo's; hf: transformers', with its `early_stopping`)."""
    check_beam(beam, style, early_stopping)
    cfg = model.cfg
    if cfg.positions == "learned" and max_len > cfg.max_len:
        raise ValueError(f"max_len={max_len} is above the model's learned positions (model.max_len={cfg.max_len})")
    kw = dict(model=model, max_len=int(max_len), bos_id=int(bos_id), eos_id=int(eos_id), vocab_limit=int(vocab_limit))
    src_BS, src_valid_BS = jnp.asarray(src_BS, jnp.int32), jnp.asarray(src_valid_BS, bool)
    if beam == 1:
        ids_BL = greedy(params, src_BS, src_valid_BS, **kw)
    else:
        ids_BL = beam_search(params, src_BS, src_valid_BS, beam=int(beam), length_penalty=length_penalty, style=style,
                             early_stopping=early_stopping, **kw)[0]
    out = []
    for row in np.asarray(ids_BL).tolist():
        out.append(row[:row.index(eos_id)] if eos_id in row else row)
    return out
