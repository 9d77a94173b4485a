"""Masked-LM data: specials after the vocabulary, framing, masking statistics, (seed, step) purity,
the task's loss on the chosen positions against full logits, and a short pretraining run on the built-in
corpus whose loss falls well below ln V."""

import dataclasses
import math

import flax.linen as nn
import jax
import numpy as np
import pytest

from tests.helpers import plain_losses, tiny_configs
from tests.helpers.runs import run
from zoo import tasks
from zoo.data.tokenizers import get_tokenizer
from zoo.errors import ZooDataError
from zoo.models.bert import BERT_TINY
from zoo.tasks import mlm

TOK = get_tokenizer("bytes")
SP = mlm.bert_specials(TOK)


def test_specials_follow_the_vocabulary_and_the_model_must_hold_them():
    assert (SP.cls, SP.sep, SP.mask, SP.pad, SP.n_ordinary) == (257, 258, 259, 260, 256)
    mlm.check_bert_vocab(dataclasses.replace(BERT_TINY, vocab_size=261), TOK)
    with pytest.raises(ZooDataError) as e:
        mlm.check_bert_vocab(dataclasses.replace(BERT_TINY, vocab_size=260), TOK)
    assert "model.vocab_size=260" in str(e.value) and "= 261" in str(e.value) and "\n" not in str(e.value)


def test_frame_marks_documents_and_alternates_segments():
    eot = TOK.eot_token
    windows = np.array([[1, 2, eot, 3, 4, eot, 5]])
    ids, seg = mlm.frame(windows, eot, SP)
    assert ids.tolist() == [[SP.cls, 1, 2, SP.sep, 3, 4, SP.sep, 5, SP.sep]]
    assert seg.tolist() == [[0, 0, 0, 0, 1, 1, 1, 0, 0]]  # a [SEP] closes its segment


def test_masking_statistics_over_many_draws():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 256, (400, 512))
    ids[:, 0], ids[:, -1], ids[:, 100:110], ids[:, 300] = SP.cls, SP.sep, SP.pad, SP.sep
    special = ids >= SP.cls
    out = mlm.mask_tokens(np.random.default_rng(1), ids, SP)
    chosen = out["weights"] > 0
    inp, tgt = out["inputs"], out["targets"]
    assert not chosen[special].any()  # specials are never chosen ...
    np.testing.assert_array_equal(inp[~chosen], ids[~chosen])  # ... and nothing unchosen changes
    np.testing.assert_array_equal(tgt, ids)
    n = chosen.sum()
    assert chosen[~special].mean() == pytest.approx(0.15, abs=0.003)  # ~190k positions: sigma ~0.001
    masked = (inp[chosen] == SP.mask).mean()
    replaced = ((inp[chosen] != tgt[chosen]) & (inp[chosen] != SP.mask)).mean()
    kept = (inp[chosen] == tgt[chosen]).mean()
    assert masked == pytest.approx(0.8, abs=0.005)  # n ~ 28k: sigma ~0.0024
    # A random token equals the original 1 time in 256: it then looks kept.
    assert replaced == pytest.approx(0.1 * 255 / 256, abs=0.005)
    assert kept == pytest.approx(0.1 + 0.1 / 256, abs=0.005)
    assert inp[chosen].max() <= SP.mask and (inp[chosen & (inp != SP.mask)] < SP.n_ordinary).all()
    assert n > 20_000


def _tokens(n=5000, seed=0):
    toks = np.random.default_rng(seed).integers(0, 256, n)
    toks[::97] = TOK.eot_token
    return toks


def test_batches_are_a_pure_function_of_seed_and_step_and_split_over_processes():
    toks = _tokens()
    make = lambda seed=0, pi=0, pc=1: mlm.MlmBatches(toks, 32, 8, seed, TOK.eot_token, SP, pi, pc)
    a, b = make()(5), make()(5)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert set(a) == {"inputs", "targets", "weights", "positions", "segment_ids", "valid"}
    # Exactly round(15%) of the 30 ordinary positions per row, listed in `positions` (K = ceil(0.15 * 32)).
    ordinary = ~SP.is_special(a["targets"])
    np.testing.assert_array_equal(a["weights"].sum(1), np.maximum(1, np.floor(0.15 * ordinary.sum(1) + 0.5)))
    assert a["positions"].shape == (8, mlm.max_predictions(32)) == (8, 5)
    for w, pos in zip(a["weights"], a["positions"]):
        assert pos[:int(w.sum())].tolist() == np.flatnonzero(w).tolist() and not pos[int(w.sum()):].any()
    assert all(v.shape[0] == 8 for v in a.values())
    assert not np.array_equal(a["inputs"], make()(6)["inputs"])
    assert not np.array_equal(a["weights"], make(seed=1)(5)["weights"])
    halves = [make(pi=i, pc=2)(5) for i in range(2)]
    for k in a:
        np.testing.assert_array_equal(np.concatenate([h[k] for h in halves]), a[k])
    assert (a["targets"][:, 0] == SP.cls).all() and (a["targets"][:, -1] == SP.sep).all()
    evals = mlm.eval_batches(toks, 32, 8, 3, TOK.eot_token, SP)
    again = mlm.eval_batches(toks, 32, 8, 3, TOK.eot_token, SP)
    assert len(evals) == 3 and all(np.array_equal(x["inputs"], y["inputs"]) for x, y in zip(evals, again))


def test_encode_masked_marks_each_mask():
    ids = mlm.encode_masked("a[MASK]b[MASK]", TOK, SP)
    assert ids == [SP.cls, 97, SP.mask, 98, SP.mask, SP.sep]


def test_bert_mlm_loss_on_the_chosen_positions_equals_full_logits(cache_dir):
    """The task's loss (head on K gathered positions, fused output) against logits at every position."""
    cfg = tiny_configs.bert_mlm_pretrain(cache_dir, batch_size=4)
    task = tasks.build(cfg)
    batch = task.make_data(cfg, 0, 1).train(3)
    params = nn.unbox(jax.jit(task.init)(jax.random.PRNGKey(0)))  # jitted: one program, not one per op
    params["mlm_head"]["bias"] = jax.random.normal(jax.random.PRNGKey(1), params["mlm_head"]["bias"].shape)

    def full(p):
        logits = task.model.apply({"params": p}, batch["inputs"], batch["segment_ids"], batch["valid"])
        return plain_losses.token_cross_entropy(logits, batch["targets"], batch["weights"])

    (l1, aux), g1 = jax.jit(jax.value_and_grad(lambda p: task.loss(p, batch, jax.random.PRNGKey(0), False),
                                               has_aux=True))(params)
    (l0, c0), g0 = jax.jit(jax.value_and_grad(full, has_aux=True))(params)
    assert batch["positions"].shape[1] == mlm.max_predictions(64) < 64
    np.testing.assert_allclose(l1, l0, rtol=1e-5)
    assert float(aux["correct"]) == float(c0) and float(aux["weight"]) == batch["weights"].sum()
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), g1, g0)


def test_mlm_loss_on_the_builtin_corpus_falls_well_below_ln_v(cache_dir, tmp_path):
    out = run(tiny_configs.bert_mlm_pretrain(cache_dir), tmp_path)
    first, last = out["records"][0], out["records"][-1]
    ln_v = math.log(264)
    assert first["loss"] > 0.7 * ln_v  # it starts near uniform ...
    assert last["loss"] < 0.6 * ln_v and out["eval"]["eval_loss"] < 0.6 * ln_v  # ... and learns (3.19, 3.11 measured)
    assert out["eval"]["eval_accuracy"] > 0.1  # vs 1/264 by chance (0.20 measured)
