"""BERT: published parameter counts, numerics against a NumPy reference, padding invariance,
scan/remat equivalence, zero-initialised classifier head."""

import dataclasses
import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import erf

from zoo.models.bert import BERT_BASE, BERT_TINY, PRESETS, Bert, BertClassifier, BertMlm

# Hugging Face BertModel (with pooler) for Google's BERT releases (bert-base-uncased, bert-large-uncased,
# google/bert_uncased_L-{2,4,4,8}_H-{128,256,512,512}).
COUNTS = {"bert_tiny": 4_385_920, "bert_mini": 11_170_560, "bert_small": 28_763_648, "bert_medium": 41_373_184,
          "bert_base": 109_482_240, "bert_large": 335_141_888}
BERT_BASE_MLM = 109_514_298  # HF BertForMaskedLM(bert-base-uncased): no pooler, MLM transform + bias, tied output


def _abstract(model, T=8):
    ids = jnp.zeros((1, T), jnp.int32)
    return jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), ids, ids, ids >= 0))["params"]


def _size(tree, skip=()):
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return sum(x.size for p, x in flat if not any(s in jax.tree_util.keystr(p) for s in skip))


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_parameter_counts(name):
    # BertModel = encoder + pooler: the classifier without its output layer (never materialised).
    assert _size(_abstract(BertClassifier(PRESETS[name])), skip=("['cls_head']['out']",)) == COUNTS[name]


def test_mlm_count_and_scan_keep_the_published_numbers():
    assert _size(_abstract(BertMlm(BERT_BASE))) == BERT_BASE_MLM
    scanned = dataclasses.replace(BERT_BASE, scan_layers=True)
    assert _size(_abstract(BertClassifier(scanned)), skip=("['cls_head']['out']",)) == COUNTS["bert_base"]


def _tiny(**kw):
    base = dict(vocab_size=64, max_len=32, num_layers=2, d_model=32, num_heads=4, d_ff=64, num_classes=3, dropout=0.0)
    return dataclasses.replace(BERT_TINY, **{**base, **kw})


@functools.partial(jax.jit, static_argnames="seed")  # one compile, not one per leaf shape
def _random_params(params, seed=0):
    """Weights large enough that every nonlinearity works away from its linear regime. One normal draw cut
    into the leaves: a threefry hash per leaf made this program take 4 s to compile."""
    leaves, tree = jax.tree.flatten(params)
    flat = jax.random.normal(jax.random.PRNGKey(seed), (sum(x.size for x in leaves),))
    ends = np.cumsum([x.size for x in leaves])
    new = [(1.0 if x.ndim == 1 else 0.3) * flat[end - x.size:end].reshape(x.shape) + (x if x.ndim == 1 else 0)
           for end, x in zip(ends, leaves)]
    return jax.tree.unflatten(tree, new)


# ---- a NumPy BERT, written from the paper / HF BertModel, float64 --------------------------------
def _ln(x, p, eps):
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def _gelu(x):
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def _dense(x, p, eqn):
    return np.einsum(eqn, x, p["kernel"]) + p["bias"]


def ref_encoder(p, ids, seg, valid, cfg):
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), p)
    e, eps = p["embed"], cfg.ln_eps
    x = e["word"]["embedding"][ids] + e["position"][: ids.shape[1]][None] + e["segment"][seg]
    if not cfg.pre_ln:
        x = _ln(x, e["ln"], eps)
    for i in range(cfg.num_layers):
        b = p["encoder"][f"layer_{i}"]
        h = _ln(x, b["attn_ln"], eps) if cfg.pre_ln else x
        q, k, v = (_dense(h, b["attn"][n], "btd,dnh->btnh") for n in ("query", "key", "value"))
        s = np.einsum("btnh,bsnh->bnts", q, k) / math.sqrt(q.shape[-1])
        s = np.where(valid[:, None, None, :], s, -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = _dense(np.einsum("bnts,bsnh->btnh", a, v), b["attn"]["out"], "btnh,nhd->btd")
        x = x + o if cfg.pre_ln else _ln(x + o, b["attn_ln"], eps)
        h = _ln(x, b["mlp_ln"], eps) if cfg.pre_ln else x
        m = _dense(_gelu(_dense(h, b["mlp"]["fc"], "btd,df->btf")), b["mlp"]["proj"], "btf,fd->btd")
        x = x + m if cfg.pre_ln else _ln(x + m, b["mlp_ln"], eps)
    return _ln(x, p["encoder"]["final_ln"], eps) if cfg.pre_ln else x


def _inputs(B=2, T=12, V=60, seed=1):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, V, (B, T)).astype(np.int32)
    seg = (np.arange(T) >= T // 2).astype(np.int32)[None].repeat(B, 0)
    valid = np.arange(T)[None] < np.array([[T], [T - 4]])[:B]
    return ids, seg, valid


@pytest.mark.parametrize("pre_ln", [False, True])
def test_encoder_and_heads_match_numpy_reference(pre_ln):
    cfg = _tiny(pre_ln=pre_ln, ln_eps=1e-6)
    ids, seg, valid = _inputs()
    mlm, cls = BertMlm(cfg), BertClassifier(cfg)
    p_mlm = _random_params(nn.unbox(jax.jit(mlm.init)(jax.random.PRNGKey(0), ids, seg, valid)["params"]))
    p_cls = _random_params(nn.unbox(jax.jit(cls.init)(jax.random.PRNGKey(0), ids, seg, valid)["params"]), seed=1)
    p_cls["bert"] = p_mlm["bert"]
    hidden = ref_encoder(p_mlm["bert"], ids, seg, valid, cfg)
    r = valid  # outputs at padded positions are unspecified
    got = jax.jit(Bert(cfg).apply)({"params": p_mlm["bert"]}, ids, seg, valid)
    np.testing.assert_allclose(np.asarray(got)[r], hidden[r], rtol=1e-4, atol=1e-4)
    h = jax.tree.map(lambda a: np.asarray(a, np.float64), p_mlm["mlm_head"])
    t = _ln(_gelu(_dense(hidden, h["transform"], "btd,de->bte")), h["ln"], cfg.ln_eps)
    want = t @ np.asarray(p_mlm["bert"]["embed"]["word"]["embedding"], np.float64).T + h["bias"]
    np.testing.assert_allclose(np.asarray(jax.jit(mlm.apply)({"params": p_mlm}, ids, seg, valid))[r], want[r],
                               rtol=1e-4, atol=1e-3)
    c = jax.tree.map(lambda a: np.asarray(a, np.float64), p_cls["cls_head"])
    want = _dense(np.tanh(_dense(hidden[:, 0], c["pooler"], "bd,de->be")), c["out"], "bd,dc->bc")
    np.testing.assert_allclose(jax.jit(cls.apply)({"params": p_cls}, ids, seg, valid), want, rtol=1e-4, atol=1e-4)


def test_padding_never_changes_real_positions():
    cfg = _tiny()
    ids, seg, valid = _inputs(T=16)
    model = BertMlm(cfg)
    apply = jax.jit(model.apply)  # one compile per input shape, not one per op
    params = _random_params(nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), ids, seg, valid)["params"]))
    base = np.asarray(apply({"params": params}, ids, seg, valid))
    pad = ~valid
    # Other pad tokens and segment ids: bit-identical at the real positions.
    ids2 = np.where(pad, (ids + 7) % 60, ids)
    seg2 = np.where(pad, 1 - seg, seg)
    out = np.asarray(apply({"params": params}, ids2, seg2, valid))
    np.testing.assert_array_equal(out[valid], base[valid])
    # Longer padding: the same up to float reassociation.
    ids3 = np.concatenate([ids, np.full((2, 8), 5, np.int32)], 1)
    seg3 = np.concatenate([seg, np.ones((2, 8), np.int32)], 1)
    valid3 = np.concatenate([valid, np.zeros((2, 8), bool)], 1)
    out3 = np.asarray(apply({"params": params}, ids3, seg3, valid3))[:, :16]
    np.testing.assert_allclose(out3[valid], base[valid], rtol=1e-5, atol=1e-5)
    # The control: without the mask, the same pad change does reach the real positions.
    unmasked = np.ones_like(valid)
    a = np.asarray(apply({"params": params}, ids, seg, unmasked))
    b = np.asarray(apply({"params": params}, ids2, seg2, unmasked))
    assert not np.allclose(a[valid], b[valid], atol=1e-3)
    cls = BertClassifier(cfg)
    cls_apply = jax.jit(cls.apply)
    pc = _random_params(nn.unbox(jax.jit(cls.init)(jax.random.PRNGKey(0), ids, seg, valid)["params"]))
    np.testing.assert_array_equal(cls_apply({"params": pc}, ids2, seg2, valid),
                                  cls_apply({"params": pc}, ids, seg, valid))


def _stack(layers_parent, L):
    """Loop params layer_0..layer_{L-1} -> scanned params layer[L, ...]."""
    blocks = [layers_parent.pop(f"layer_{i}") for i in range(L)]
    layers_parent["layer"] = jax.tree.map(lambda *xs: jnp.stack(xs), *blocks)


@pytest.mark.parametrize("remat", [False, True])
def test_scan_and_remat_match_the_loop(remat):
    ids, seg, valid = _inputs()
    loop = BertMlm(_tiny())
    params = nn.unbox(jax.jit(loop.init)(jax.random.PRNGKey(0), ids, seg, valid)["params"])
    sparams = jax.tree.map(lambda x: x, params)
    _stack(sparams["bert"]["encoder"], 2)
    scanned = BertMlm(_tiny(scan_layers=True, remat=remat))
    # Both sides jitted: one compile each, not one per op.
    np.testing.assert_allclose(jax.jit(scanned.apply)({"params": sparams}, ids, seg, valid),
                               jax.jit(loop.apply)({"params": params}, ids, seg, valid), atol=1e-5, rtol=1e-5)
    g_loop = jax.jit(jax.grad(lambda p: loop.apply({"params": p}, ids, seg, valid).sum()))(params)
    g_scan = jax.jit(jax.grad(lambda p: scanned.apply({"params": p}, ids, seg, valid).sum()))(sparams)
    np.testing.assert_allclose(g_scan["bert"]["encoder"]["layer"]["mlp"]["fc"]["kernel"][1],
                               g_loop["bert"]["encoder"]["layer_1"]["mlp"]["fc"]["kernel"], atol=1e-4, rtol=1e-4)


def test_fresh_classifier_predicts_uniform_and_trains_the_encoder():
    ids, seg, valid = _inputs()
    model = BertClassifier(_tiny())
    params = nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), ids, seg, valid)["params"])
    np.testing.assert_array_equal(jax.jit(model.apply)({"params": params}, ids, seg, valid), np.zeros((2, 3)))
    grads = jax.jit(jax.grad(lambda p: -jax.nn.log_softmax(model.apply({"params": p}, ids, seg, valid))[:, 0].sum()))(
        params)
    assert np.abs(grads["cls_head"]["out"]["kernel"]).max() > 0


def test_bfloat16_compute_keeps_float32_params_and_logits():
    cfg = _tiny(dtype="bfloat16")
    ids, seg, valid = _inputs()
    for model in (BertMlm(cfg), BertClassifier(cfg)):
        v = jax.jit(model.init)(jax.random.PRNGKey(0), ids, seg, valid)
        assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(nn.unbox(v["params"])))
        assert jax.jit(model.apply)(v, ids, seg, valid).dtype == jnp.float32
