"""Distillation (distill.teacher on gpt_lm / sft, zoo.tasks.distill): the loss against a NumPy formula, a KL of 0
when the student is its teacher (gpt_lm's rows and sft's packed ones), a tiny teacher distilled into a smaller
student over 20 steps (its KL falls; the run resumes with the teacher read again, no checkpoint holding it), and
bad settings refused in one line naming the key."""

import dataclasses
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
from tests.helpers.runs import run
from zoo import tasks
from zoo.configuration import Config, DistillConfig
from zoo.errors import ConfigError
from zoo.tasks import distill
from zoo.training import sharding


def np_loss(z, u, targets, w, T, alpha):
    """alpha T^2 KL(softmax(u/T) || softmax(z/T)) + (1 - alpha) CE(z), summed over weighted tokens, in NumPy."""
    def log_softmax(x):
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))
    s, t = log_softmax(z / T), log_softmax(u / T)
    kl = (np.exp(t) * (t - s)).sum(-1)
    ce = -np.take_along_axis(log_softmax(z), targets[..., None], -1)[..., 0]
    return float((w * (alpha * T * T * kl + (1 - alpha) * ce)).sum()), float((w * kl).sum() * T * T)


def test_loss_is_the_formula():
    r = np.random.default_rng(0)
    z, u = r.normal(size=(2, 3, 7)) * 3, r.normal(size=(2, 3, 7)) * 3
    targets = r.integers(0, 7, (2, 3))
    w = np.array([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    cfg = DistillConfig(teacher="x", temperature=2.0, alpha=0.3)
    loss, _, sums = distill.mixed_loss(cfg, jnp.asarray(z, jnp.float32), jnp.asarray(u, jnp.float32),
                                       jnp.asarray(targets), jnp.asarray(w))
    want, want_kl = np_loss(z, u, targets, w, 2.0, 0.3)
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)
    np.testing.assert_allclose(float(sums["kl_sum"]), want_kl, rtol=1e-5)


def student_task(cfg, task="gpt_lm"):
    """The task of cfg with a teacher, its module the student's own (the student its own teacher)."""
    cfg = dataclasses.replace(cfg, task=task, distill=DistillConfig(teacher="unused", alpha=0.5))
    t = tasks.build(cfg)
    t.teacher.model = t.model
    return t


@pytest.mark.parametrize("task", ["gpt_lm", "sft"])
def test_student_as_its_own_teacher_has_no_kl(tiny_cfg, task):
    t = student_task(tiny_cfg, task)
    params = nn.unbox(t.init(jax.random.PRNGKey(0)))
    ids = jax.random.randint(jax.random.PRNGKey(1), (2, 33), 0, 256)
    batch = {"inputs": ids[:, :-1], "targets": ids[:, 1:], "weights": jnp.ones((2, 32)).at[:, :5].set(0.0)}
    if task == "sft":  # two examples packed in each row
        batch["segment_ids"] = jnp.concatenate([jnp.ones((2, 20), jnp.int32), 2 * jnp.ones((2, 12), jnp.int32)], 1)
        batch["positions"] = jnp.concatenate([jnp.arange(20), jnp.arange(12)])[None].repeat(2, 0)
    rng = jax.random.PRNGKey(2)
    loss, aux = t.loss(params, batch, rng, False, teacher=params)
    plain, plain_aux = t.loss(params, batch, rng, False)
    assert abs(float(aux["kl_sum"])) < 1e-4 * float(aux["weight"])
    # the cross-entropy of the full logits is the fused loss's, and the mix its half with alpha = 0.5
    np.testing.assert_allclose(float(aux["ce_sum"]), float(plain), rtol=1e-5)
    np.testing.assert_allclose(float(loss), 0.5 * float(plain), rtol=1e-4)
    assert float(aux["correct"]) == float(plain_aux["correct"])


@pytest.fixture(scope="module")
def teacher_run(cache_dir, tmp_path_factory):
    """A gpt_tiny-shaped teacher (2 layers, width 64) trained 12 steps on the built-in corpus."""
    path = tmp_path_factory.mktemp("distill") / "teacher"
    cfg = replace(tiny_configs.gpt_lm(cache_dir), train=dict(steps=12, save_every=12, log_every=12),
                  model=dict(dropout=0.0))
    run(cfg, path, quiet=True)
    return str(path)


def student_cfg(cache_dir, teacher, **distill_kw):
    """A smaller student (1 layer, width 32, the teacher's vocabulary) of `teacher`."""
    cfg = replace(tiny_configs.gpt_lm(cache_dir),
                  train=dict(steps=20, save_every=10, log_every=1, eval_every=20, eval_batches=2),
                  model=dict(num_layers=1, d_model=32, num_heads=2, d_ff=64, dropout=0.0), optim=dict(lr=3e-3))
    return dataclasses.replace(cfg, distill=DistillConfig(teacher=teacher, **{"alpha": 1.0, **distill_kw}))


def test_a_tiny_teacher_distils_into_a_smaller_student(cache_dir, teacher_run, tmp_path):
    work = tmp_path / "student"
    cfg = student_cfg(cache_dir, teacher_run, temperature=2.0)
    run(cfg, work, quiet=True, stop_at_step=10)
    out = run(cfg, work, quiet=True, resume=True)  # the teacher read again from distill.teacher
    with open(os.path.join(work, "metrics.jsonl")) as f:
        records = [r for r in map(json.loads, f) if "kl" in r]
    kl = {r["step"]: r["kl"] for r in records}
    assert sorted(kl) == list(range(1, 21))
    assert np.mean([kl[s] for s in (18, 19, 20)]) < 0.6 * np.mean([kl[s] for s in (1, 2, 3)]), kl
    assert all(r["loss"] == pytest.approx(r["kl"], rel=1e-5) for r in records)  # alpha = 1: the KL alone
    assert np.isfinite(out["eval"]["eval_loss"])  # the student's own cross-entropy
    # the checkpoints hold the student alone: its params' shapes, nothing of the teacher's
    from zoo.training import runs
    _, saved_cfg, params = runs.load_weights(str(work))
    assert params["wte"]["embedding"].shape == (384, 32) and saved_cfg.distill.teacher == teacher_run
    assert not os.path.exists(os.path.join(work, "checkpoints", "20", "teacher"))


def test_a_teacher_of_another_vocabulary_or_length_is_refused(cache_dir, teacher_run, tmp_path):
    cfg = replace(student_cfg(cache_dir, teacher_run), model=dict(vocab_size=320))
    with pytest.raises(ConfigError) as e:
        run(cfg, tmp_path / "w", quiet=True)
    msg = str(e.value)
    assert "\n" not in msg and "distill.teacher=" in msg and "vocab_size=384" in msg and "vocab_size=320" in msg
    assert not os.path.exists(tmp_path / "w")  # no workdir left behind
    longer = replace(student_cfg(cache_dir, teacher_run), data=dict(seq_len=128), model=dict(max_len=128))
    with pytest.raises(ConfigError, match=r"reads 64 positions \(model.max_len\) but data.seq_len=128; set "
                                          r"data.seq_len <= 64"):
        distill.Teacher(longer).load(sharding.make_mesh(longer.mesh), zoo.load)


def test_bad_settings_are_refused_in_one_line(cache_dir, tmp_path):
    cfg = tiny_configs.gpt_lm(cache_dir)
    with pytest.raises(ConfigError, match=r"distill.teacher: .*no such file or directory, and no preset"):
        tasks.check_data(dataclasses.replace(cfg, distill=DistillConfig(teacher=str(tmp_path / "nothing"))))
    for bad, key in ((dict(alpha=1.5), r"distill.alpha=1.5 must be in \[0, 1\]"),
                     (dict(alpha=-0.1), r"distill.alpha=-0.1 must be in \[0, 1\]"),
                     (dict(temperature=0.0), "distill.temperature=0.0 must be a positive number"),
                     (dict(beta=2.0), r"distill.beta=2.0 must be in \[0, 1\]")):
        with pytest.raises(ConfigError, match=key):
            DistillConfig(teacher="gpt_tiny", **bad)
    with pytest.raises(ConfigError, match="distill.teacher distils into task=gpt_lm or sft; task='dpo'"):
        Config(task="dpo", model=cfg.model, distill=DistillConfig(teacher="gpt_tiny"))


def test_the_trainer_called_without_zoo_load_refuses_a_teacher_in_one_line(cache_dir, teacher_run, tmp_path):
    """The tasks sit below zoo.api: zoo.train hands the trainer zoo.load to read the teacher (teacher_of); the
    trainer called on its own without it says so instead of importing the loader."""
    from zoo.training import trainer
    with pytest.raises(ConfigError, match=r"^distill.teacher=.*hands the trainer zoo.load; call zoo.train, or "
                                          r"trainer.train\(..., teacher_of=zoo.load\)$"):
        trainer.train(student_cfg(cache_dir, teacher_run), str(tmp_path / "w"), progress=False, quiet=True)
