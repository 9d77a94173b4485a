"""The teacher's top-k logits cached offline (distill.top_k, zoo.tasks.teacher_cache): over the whole vocabulary the
cached loss is the live teacher's, below it the KL over the k ids and a rest bucket of a NumPy formula; the cache
holds the teacher's own top-k of each fixed row, is built once and read by later runs without the teacher, an
interrupted build leaves no cache, a resumed run reproduces the uninterrupted one bit for bit, and bad settings are
refused in one line."""

import dataclasses
import glob
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from tests.conftest import replace
from tests.helpers import tiny_configs
from tests.helpers.runs import run, write_jsonl
from tests.tasks.test_distill import student_cfg, teacher_run  # noqa: F401 (a fixture)
from zoo.configuration import Config, DistillConfig
from zoo.errors import ConfigError
from zoo.tasks import distill, teacher_cache
from zoo.training import runs


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_cached_top_k_is_the_live_teacher_over_the_vocabulary_and_the_kl_with_a_rest_bucket_below_it(tiny_cfg):
    t = zoo.tasks.build(dataclasses.replace(tiny_cfg, distill=DistillConfig(teacher="unused", alpha=0.7,
                                                                             temperature=2.0)))
    t.teacher.model = t.model  # the teacher: another model of the student's shape
    params, teacher = (nn.unbox(t.init(jax.random.PRNGKey(i))) for i in (0, 5))
    ids = jax.random.randint(jax.random.PRNGKey(1), (2, 33), 0, 256)
    batch = {"inputs": ids[:, :-1], "targets": ids[:, 1:], "weights": jnp.ones((2, 32)).at[:, :5].set(0.0)}
    rng = jax.random.PRNGKey(2)
    live, live_aux = t.loss(params, batch, rng, False, teacher=teacher)
    u = t.teacher.logits(teacher, batch["inputs"])
    lse = jax.nn.logsumexp(u / 2.0, -1)

    def cached(k):
        vals, which = jax.lax.top_k(u, k)
        return t.loss(params, {**batch, "teacher_ids": which, "teacher_logits": vals, "teacher_lse": lse}, rng,
                      False), vals, which
    (loss, aux), _, _ = cached(u.shape[-1])
    np.testing.assert_allclose(float(loss), float(live), rtol=1e-5)
    np.testing.assert_allclose(float(aux["kl_sum"]), float(live_aux["kl_sum"]), rtol=1e-5)
    assert float(live_aux["kl_sum"]) > 1.0  # two different models: the equality compares something

    # below the vocabulary: the KL over the k ids and one bucket for the rest, as NumPy computes it
    (_, aux), vals, which = cached(7)
    z = np.asarray(distill.student_logits(t.hidden(params, batch["inputs"], False, rng)[0],
                                          params["wte"]["embedding"]), np.float64)
    s = np.take_along_axis(log_softmax(z / 2.0), np.asarray(which), -1)
    p = np.asarray(vals, np.float64) / 2.0 - np.asarray(lse, np.float64)[..., None]
    p_rest, q_rest = 1 - np.exp(p).sum(-1), np.maximum(1 - np.exp(s).sum(-1), np.finfo(np.float32).eps)
    kl = (np.exp(p) * (p - s)).sum(-1) + p_rest * (np.log(p_rest) - np.log(q_rest))
    want = 4.0 * (kl * np.asarray(batch["weights"])).sum()
    np.testing.assert_allclose(float(aux["kl_sum"]), want, rtol=1e-5)
    assert 0 < float(aux["kl_sum"]) < float(live_aux["kl_sum"])  # coarser: at most the full KL (log-sum inequality)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """About 40k characters of Python's own docs, a document a topic: a corpus the teacher reads in seconds."""
    from pydoc_data.topics import topics
    docs, n = [], 0
    for name in sorted(topics):
        docs.append({"text": topics[name]})
        n += len(topics[name])
        if n > 40_000:
            break
    return write_jsonl(tmp_path_factory.mktemp("corpus") / "docs.jsonl", docs)


def topk_cfg(cache_dir, teacher, k, corpus, **train):
    cfg = student_cfg(cache_dir, teacher, top_k=k, temperature=2.0)
    return replace(cfg, data=dict(source=corpus), train=dict(steps=6, save_every=3, eval_every=6, **train))


def caches(cache_dir):
    return sorted(glob.glob(os.path.join(cache_dir, "teacher-*")))


def test_the_cache_holds_the_teachers_top_k_of_each_row_and_is_built_once(cache_dir, teacher_run, corpus,
                                                                           tmp_path, capsys, monkeypatch):
    before = caches(cache_dir)
    cfg = topk_cfg(cache_dir, teacher_run, 5, corpus)
    out = run(cfg, tmp_path / "a", quiet=True)
    new = [c for c in caches(cache_dir) if c not in before]
    assert len(new) == 1 and "caching the teacher's top-5 logits" in capsys.readouterr().out
    with open(os.path.join(new[0], "meta.json")) as f:
        meta = json.load(f)
    ids, logits = np.load(os.path.join(new[0], "ids.npy")), np.load(os.path.join(new[0], "logits.npy"))
    lse = np.load(os.path.join(new[0], "lse.npy"))
    assert ids.shape == logits.shape == (meta["rows"], 32, 5) and meta["vocab_size"] == 384
    assert lse.shape == (meta["rows"], 32) and meta["temperature"] == 2.0
    # row 3 of the cache is the teacher's own top-5 on the corpus's fourth window
    pre = zoo.load(teacher_run)
    rows = zoo.tasks.build(cfg).make_data(cfg, 0, 1).train.source  # the fixed rows the cache is of
    row = rows.of(np.array([3]))
    u = pre.model.apply({"params": pre.params}, jnp.asarray(row["inputs"]), deterministic=True)
    vals, which = jax.lax.top_k(u.astype(jnp.float32), 5)
    np.testing.assert_allclose(logits[3], np.asarray(vals[0]), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse[3], np.asarray(jax.nn.logsumexp(u[0].astype(jnp.float32) / 2.0, -1)), rtol=1e-5)
    assert (ids[3] == np.asarray(which[0])).mean() > 0.99  # ties aside
    # a step's batch carries the cached top-k of its own rows
    data = zoo.tasks.build(cfg).make_data(cfg, 0, 1)
    data.train.cache = teacher_cache.open_cache(new[0], 384)
    b = data.train(2)
    u = pre.model.apply({"params": pre.params}, jnp.asarray(b["inputs"]), deterministic=True)
    np.testing.assert_allclose(b["teacher_logits"], np.asarray(jax.lax.top_k(u.astype(jnp.float32), 5)[0]),
                               rtol=1e-5, atol=1e-5)
    assert np.isfinite(out["eval"]["eval_loss"])

    # another run of the same teacher, rows and k reads the cache: the teacher is never loaded
    monkeypatch.setattr(distill.Teacher, "load", lambda *a: pytest.fail("the teacher was loaded"))
    run(replace(cfg, train=dict(seed=3)), tmp_path / "b", quiet=True)
    assert caches(cache_dir) == sorted(before + new) and "read from" in capsys.readouterr().out


def test_a_resumed_run_reads_what_the_uninterrupted_one_read(cache_dir, teacher_run, corpus, tmp_path):
    cfg = topk_cfg(cache_dir, teacher_run, 4, corpus)
    run(cfg, tmp_path / "whole", quiet=True)
    run(cfg, tmp_path / "halves", quiet=True, stop_at_step=3)
    run(cfg, tmp_path / "halves", quiet=True, resume=True)
    a, b = (runs.load_weights(str(tmp_path / w))[2] for w in ("whole", "halves"))
    assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
    with open(tmp_path / "whole" / "metrics.jsonl") as f:
        assert [r["kl"] > 0 for r in map(json.loads, f) if "kl" in r] == [True] * 6


def test_an_interrupted_build_leaves_no_cache(cache_dir, teacher_run, corpus, tmp_path):
    cfg = topk_cfg(str(tmp_path / "cache"), teacher_run, 3, corpus)
    data = zoo.tasks.build(cfg).make_data(cfg, 0, 1)
    rows = data.train.source
    calls = []
    real = rows.of

    def of(idx):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(idx)
    rows.of = of
    pre = zoo.load(teacher_run)
    teacher = distill.Teacher(cfg)
    teacher.model = pre.model
    path = str(tmp_path / "cache" / "teacher-x")
    with pytest.raises(KeyboardInterrupt):
        teacher_cache.build(path, teacher, pre.params, rows, 3, 1.0, 16, say=lambda _: None)
    left = os.listdir(tmp_path / "cache")
    assert left and not any("teacher-x" in n for n in left), left  # the token store stays; nothing of the cache


def test_bad_top_k_settings_are_refused_in_one_line(cache_dir):
    for kw, msg in ((dict(top_k=-1), r"^distill.top_k=-1 must be a whole number >= 0"),
                    (dict(top_k=8, beta=0.5), r"^distill.top_k=8 trains the forward KL .* distill.beta=0.5 needs"),
                    (dict(top_k=8, teacher=""), r"^distill.top_k=8 caches a teacher's logits; name the teacher"),
                    (dict(top_k=8, on_policy=0.5), r"^distill.top_k=8 reads .* distill.on_policy=0.5 needs the "
                                                    r"teacher live")):
        with pytest.raises(ConfigError, match=msg):
            DistillConfig(**{"teacher": "gpt_tiny", **kw})
    cfg = tiny_configs.gpt_lm(cache_dir)
    with pytest.raises(ConfigError, match=r"^distill.top_k=8 caches .* data.streaming=true has none"):
        Config(task="gpt_lm", model=cfg.model, data=dataclasses.replace(cfg.data, streaming=True),
               distill=DistillConfig(teacher="gpt_tiny", top_k=8))


def test_sft_caches_the_teachers_top_k_of_each_packed_row(tmp_path):
    from tests.tasks.test_sft_task import CHATS, sft_cfg
    source = write_jsonl(tmp_path / "chats.jsonl", [{"messages": m} for m in CHATS])
    teacher_cfg = replace(sft_cfg(tmp_path, source), train=dict(steps=3, save_every=3))
    run(teacher_cfg, tmp_path / "teacher", quiet=True)
    cfg = dataclasses.replace(teacher_cfg, distill=DistillConfig(teacher=str(tmp_path / "teacher"), top_k=6))
    out = run(cfg, tmp_path / "student", quiet=True)
    assert np.isfinite(out["eval"]["eval_loss"])
    [path] = caches(str(tmp_path / "cache"))
    rows = zoo.tasks.build(cfg).make_data(cfg, 0, 1).train.source
    assert np.load(os.path.join(path, "ids.npy")).shape == (rows.n, 96, 6)
    # a packed row's logits are the teacher's on that row, each example attending within its own segment
    row = rows.of(np.array([1]))
    pre = zoo.load(str(tmp_path / "teacher"))
    u = pre.model.apply({"params": pre.params}, jnp.asarray(row["inputs"]), deterministic=True,
                        positions_BT=jnp.asarray(row["positions"]), segment_ids_BT=jnp.asarray(row["segment_ids"]))
    vals = jax.lax.top_k(u.astype(jnp.float32), 6)[0]
    np.testing.assert_allclose(np.load(os.path.join(path, "logits.npy"))[1], np.asarray(vals[0]), atol=1e-5)
    assert int((row["segment_ids"] > 1).sum()) > 0  # the row packs several examples: the segments matter


def test_compile_for_compiles_the_cached_step_before_any_cache_is_built(cache_dir, teacher_run, corpus, tmp_path):
    """--compile-for on a distill.top_k config: the step that reads the teacher's [B, T, k] arrays, no cache built."""
    cfg = topk_cfg(str(tmp_path / "cache"), teacher_run, 7, corpus)
    report = zoo.compile_for(cfg, "v5e:2x2")
    assert report["fits"] and not caches(str(tmp_path / "cache"))
    data = zoo.tasks.build(cfg).make_data(cfg, 0, 1)
    shaped = data.train.shaped(0)
    assert shaped["teacher_ids"].shape == (16, 32, 7) and shaped["teacher_lse"].shape == (16, 32)
