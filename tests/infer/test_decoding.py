"""Greedy and beam-search decoding: cached greedy equals full recomputation, beam 1 equals greedy,
a wide beam finds the exhaustive best (GNMT and transformers' scoring), one compile per shape, bad beam
sizes and styles refused. (Token-for-token equality with transformers' generate: tests/hf.)"""

import itertools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zoo.infer import decoding
from zoo.models.encdec import EncDecConfig
from zoo.models.encdec import EncDec

CFG = EncDecConfig(vocab_size=40, max_len=16, num_encoder_layers=1, num_decoder_layers=2, d_model=32, num_heads=4,
                   d_ff=64, dropout=0.0, positions="sinusoidal", pre_ln=True, tie_output=False)
BOS, L = 38, 8


@pytest.fixture(scope="module")
def setup():
    model = EncDec(CFG)
    src = jax.random.randint(jax.random.PRNGKey(1), (3, 6), 0, 36)
    valid = jnp.arange(6)[None] < jnp.array([[6], [4], [5]])
    params = nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), src, valid, jnp.zeros((3, 4), jnp.int32))["params"])
    # Larger weights (and an untied output) make the untrained model's argmax vary by step and by row.
    params = jax.tree.map(lambda x: x * 3 if x.ndim >= 2 else x, params)
    return model, params, src, valid


def full_greedy(model, params, src, valid, eos, vocab_limit):
    """Greedy by recomputing the whole decoder over the prefix at every step (no cache)."""
    ids = jnp.full((src.shape[0], 1), BOS, jnp.int32)
    out, apply = [], jax.jit(model.apply)  # one compile per prefix length, not one per op
    for _ in range(L):
        logits = apply({"params": params}, src, valid, ids)[:, -1, :vocab_limit]
        tok = jnp.argmax(logits, -1).astype(jnp.int32)
        out.append(tok)
        ids = jnp.concatenate([ids, tok[:, None]], 1)
    rows = np.stack(out, 1).tolist()
    return [r[:r.index(eos)] if eos in r else r for r in rows]


def test_cached_greedy_equals_full_recomputation(setup):
    model, params, src, valid = setup
    raw = np.asarray(decoding.greedy(params, src, valid, model=model, max_len=L, bos_id=BOS, eos_id=36,
                                     vocab_limit=36))
    assert len({tuple(r) for r in raw}) > 1 and len(set(raw[0].tolist())) > 1  # a test that can fail
    # EOS = a token row 0 emits at step 3, so that at least one row stops early.
    eos = int(raw[0, 3])
    kw = dict(max_len=L, bos_id=BOS, eos_id=eos, vocab_limit=36)
    cached = decoding.generate(model, params, src, valid, **kw)
    assert cached == full_greedy(model, params, src, valid, eos, 36)
    assert len(cached[0]) <= 3


def test_beam_one_equals_greedy(setup):
    model, params, src, valid = setup
    raw = np.asarray(decoding.greedy(params, src, valid, model=model, max_len=L, bos_id=BOS, eos_id=36,
                                     vocab_limit=36))
    for eos in (36, int(raw[1, 2])):  # no row ends; some rows end early
        kw = dict(model=model, max_len=L, bos_id=BOS, eos_id=eos, vocab_limit=36)
        greedy = np.asarray(decoding.greedy(params, src, valid, **kw))
        beam, _ = decoding.beam_search(params, src, valid, beam=1, length_penalty=0.0, **kw)
        np.testing.assert_array_equal(np.asarray(beam), greedy)


# Tokens 0, 1 and EOS = 2; at most 3 output tokens: every EOS-terminated sequence of length <= 3 and every
# unfinished one of length 3.
V3, EOS3, N3 = 3, 2, 3
CANDS = [list(p) + [EOS3] for k in range(N3) for p in itertools.product(range(2), repeat=k)] + \
    [list(p) for p in itertools.product(range(2), repeat=N3)]


@pytest.fixture(scope="module")
def exhaustive(setup):
    """Per row, the log-probability of every candidate by teacher forcing (one batched forward per row),
    normalised over every row of the model, the ones past V3 (never produced) included, as transformers does."""
    model, params, src, valid = setup
    tgt_in = jnp.asarray([[BOS] + c[:-1] + [0] * (N3 - len(c)) for c in CANDS])  # causal: the fill never matters
    forward, rows = jax.jit(model.apply), []
    for b in range(src.shape[0]):
        logp_CTV = jax.nn.log_softmax(forward({"params": params}, jnp.repeat(src[b:b + 1], len(CANDS), 0),
                                              jnp.repeat(valid[b:b + 1], len(CANDS), 0), tgt_in))[:, :, :V3]
        logp_CTV = np.asarray(logp_CTV)  # indexed below in NumPy, not op by op
        rows.append([float(sum(logp_CTV[i, t, tok] for t, tok in enumerate(c))) for i, c in enumerate(CANDS)])
    return rows


def check_best(ids, scores, rows, score_of):
    for b, logps in enumerate(rows):
        ranked = [score_of(lp, c) for lp, c in zip(logps, CANDS)]
        best = int(np.argmax(ranked))
        got = np.asarray(ids[b]).tolist()
        assert (got[:got.index(EOS3) + 1] if EOS3 in got else got) == CANDS[best]
        assert float(scores[b]) == pytest.approx(ranked[best], rel=1e-5)


def test_wide_beam_finds_the_exhaustive_best(setup, exhaustive):
    model, params, src, valid = setup
    ids, scores = decoding.beam_search(params, src, valid, model=model, beam=9, max_len=N3, length_penalty=0.0,
                                       bos_id=BOS, eos_id=EOS3, vocab_limit=V3)
    check_best(ids, scores, exhaustive, lambda logp, c: logp)


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_hf_style_wide_beam_with_early_stopping_never_finds_the_exhaustive_best(setup, exhaustive, alpha):
    """transformers' rule: "never" (with alpha > 0, judged at max_len) is exact, and the score is
    log p / length^alpha (GNMT's ((5 + length) / 6)^alpha would give another value)."""
    model, params, src, valid = setup
    ids, scores = decoding.beam_search(params, src, valid, model=model, beam=9, max_len=N3, length_penalty=alpha,
                                       bos_id=BOS, eos_id=EOS3, vocab_limit=V3, style="hf", early_stopping="never")
    check_best(ids, scores, exhaustive, lambda logp, c: logp / len(c) ** alpha)


def test_hf_style_beam_one_equals_greedy(setup):
    model, params, src, valid = setup
    raw = np.asarray(decoding.greedy(params, src, valid, model=model, max_len=L, bos_id=BOS, eos_id=36,
                                     vocab_limit=36))
    kw = dict(model=model, max_len=L, bos_id=BOS, eos_id=int(raw[1, 2]), vocab_limit=36)  # some rows end early
    greedy = np.asarray(decoding.greedy(params, src, valid, **kw))
    for early in (False, True):
        beam, _ = decoding.beam_search(params, src, valid, beam=1, length_penalty=1.0, style="hf",
                                       early_stopping=early, **kw)
        np.testing.assert_array_equal(np.asarray(beam), greedy)


def test_decoding_compiles_once_per_shape(setup):
    model, params, src, valid = setup
    kw = dict(model=model, max_len=L, bos_id=BOS, eos_id=36, vocab_limit=36)
    decoding.greedy(params, src, valid, **kw)
    before = decoding.greedy._cache_size()
    decoding.greedy(params, (src + 1) % 36, valid, **kw)  # new values, same shapes: no new compile
    assert decoding.greedy._cache_size() == before
    decoding.greedy(params, src[:2], valid[:2], **kw)  # a new batch size compiles once more
    assert decoding.greedy._cache_size() == before + 1


def test_beam_size_below_one_and_unknown_styles_are_refused(setup):
    model, params, src, valid = setup
    kw = dict(max_len=L, bos_id=BOS, eos_id=36, vocab_limit=36)
    with pytest.raises(ValueError, match="beam size 0 must be >= 1"):
        decoding.generate(model, params, src, valid, beam=0, **kw)
    with pytest.raises(ValueError, match="beam style 'fairseq' is unknown; choose one of gnmt, hf"):
        decoding.generate(model, params, src, valid, beam=2, style="fairseq", **kw)
    with pytest.raises(ValueError, match="early_stopping='always'; choose True, False or 'never'"):
        decoding.generate(model, params, src, valid, beam=2, style="hf", early_stopping="always", **kw)
