"""On-policy distillation (distill.on_policy on task=sft, zoo.tasks.gkd): off (0) a run trains bit for bit as one
without the settings; on every step (1) the batch's weighted targets are the student's own greedy answers to the data
batch's prompts, in a batch of the data batch's keys, shapes and dtypes; the steps chosen are a function of
(train.seed, step), and a resumed run equals an uninterrupted one bit for bit; the loss on the sampled rows is TRL's
generalized_jsd_loss alone (no cross-entropy); bad settings are one line naming the key."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.conftest import replace
from tests.helpers import tiny_configs
from tests.helpers.runs import run
from zoo import tasks
from zoo.configuration import Config, DataConfig, DistillConfig, OptimConfig, TrainConfig
from zoo.errors import ConfigError
from zoo.infer.sample import generate, stop_ids
from zoo.models.gpt import GptConfig
from zoo.tasks import gkd

# short single-turn sums (two examples fit a 64-token row) and one two-turn conversation
CHATS = [[{"role": "user", "content": f"{a}+{b}?"}, {"role": "assistant", "content": str(a + b)}]
         for a in range(8) for b in range(8)]
CHATS.append([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
              {"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}])


@pytest.fixture(scope="module")
def teacher_run(cache_dir, tmp_path_factory):
    """A gpt_tiny-shaped teacher (2 layers, width 64, 384 ids, 64 positions), 4 steps on the built-in corpus."""
    path = tmp_path_factory.mktemp("gkd") / "teacher"
    run(replace(tiny_configs.gpt_lm(cache_dir), train=dict(steps=4, save_every=4, log_every=4),
                model=dict(dropout=0.0)), path, quiet=True)
    return str(path)


def gkd_cfg(cache_dir, teacher="unused", steps=4, **distill):
    """A 1-layer width-32 sft student of the teacher's vocabulary on CHATS, 8 rows of 64 a step (one a device)."""
    chats = tiny_configs.jsonl(cache_dir, "gkd_chats.jsonl", [{"messages": m} for m in CHATS])
    return Config(task="sft",
                  model=GptConfig(vocab_size=384, max_len=64, num_layers=1, d_model=32, num_heads=2, d_ff=64,
                                  dropout=0.0),
                  data=DataConfig(source=chats, tokenizer="bytes", seq_len=64, val_fraction=0.1, cache_dir=cache_dir),
                  optim=OptimConfig(lr=3e-3, warmup=1),
                  train=TrainConfig(steps=steps, batch_size=8, log_every=1, eval_every=0, save_every=2, keep=5),
                  distill=DistillConfig(**{"teacher": teacher, "alpha": 0.5, **distill}))


def student(cfg, seed=0):
    task = tasks.build(cfg)
    return task, nn.unbox(task.init(jax.random.PRNGKey(seed))), task.make_data(cfg, 0, 1)


def answers_of(batch, r):
    """Row r's examples as (prompt ids, weighted target ids), in order."""
    out = []
    for s in np.unique(batch["segment_ids"][r][batch["segment_ids"][r] > 0]):
        at = np.flatnonzero(batch["segment_ids"][r] == s)
        w = batch["weights"][r][at] > 0
        first = np.flatnonzero(w)[0]
        out.append((batch["inputs"][r][at[0]:at[first] + 1].tolist(), batch["targets"][r][at][w].tolist()))
    return out


def test_on_policy_0_trains_bit_for_bit_as_without_the_settings(cache_dir, teacher_run, tmp_path):
    plain = gkd_cfg(cache_dir, teacher_run, steps=2)
    off = gkd_cfg(cache_dir, teacher_run, steps=2, on_policy=0.0, max_new_tokens=5, sample_temperature=0.0)
    assert not hasattr(tasks.build(off), "rollout")  # the trainer prefetches its data batches as it always did
    a, b = run(plain, tmp_path / "plain", quiet=True), run(off, tmp_path / "off", quiet=True)
    for x, y in zip(jax.tree.leaves(a["params"]), jax.tree.leaves(b["params"])):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert "on_policy_share" not in a["records"][-1] and "on_policy_share" not in b["records"][-1]


def test_on_policy_1_trains_the_students_greedy_answers_to_the_batchs_prompts(cache_dir):
    cfg = gkd_cfg(cache_dir, on_policy=1.0, max_new_tokens=6, sample_temperature=0.0)
    task, params, data = student(cfg)
    batch = data.train(3)
    out, host = task.rollout(params, batch, 3, data)
    assert set(out) == set(batch) | {"on_policy"}
    for k in batch:
        assert out[k].shape == batch[k].shape and out[k].dtype == batch[k].dtype, k
    np.testing.assert_array_equal(out["on_policy"], np.ones(8, np.float32))
    eos = stop_ids(data.tokenizer)
    prompts = [p for row in gkd.prompts_of(batch) for _, p in row]
    long = [p for p in prompts if len(p) + 6 > cfg.window]
    got = [x for r in range(8) for x in answers_of(out, r)]
    assert len(got) == host["kept_answers"] >= 8 and host["sampled_answers"] == len(prompts)
    for prompt, answer in got:  # each kept example: a data prompt and the student's greedy answer to it
        assert prompt in prompts
        # a prompt that leaves less than 6 tokens of the window is sampled with the others that do, to what the
        # longest of them leaves
        cap = 6 if len(prompt) + 6 <= cfg.window else cfg.window - max(map(len, long))
        greedy = generate(task.model, params, prompt, cap, temperature=0.0, eos_id=eos, vocab_limit=257,
                          window=cfg.window)[0]
        assert answer == greedy + ([eos[0]] if len(greedy) < cap else []), (prompt, answer, greedy)
    # the data's answers are other tokens: what trains is the student's own sample
    assert [a for r in range(8) for _, a in answers_of(batch, r)][:len(got)] != [a for _, a in got]
    assert host["on_policy_steps"] == 1.0 and host["sampled_tokens"] >= sum(len(a) for _, a in got)

def test_a_prompt_is_its_example_before_the_last_answer():
    """Per packed example: the tokens before its last run of weighted targets (earlier answers are context)."""
    seg = np.array([[1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 0, 0]])
    w = np.array([[0, 1, 0, 0, 1, 1, 0, 0, 1, 0, 0, 0]], np.float32)  # example 1: two answers; example 2: one
    batch = {"inputs": np.arange(12)[None] + 100, "weights": w, "segment_ids": seg}
    assert gkd.prompts_of(batch) == [[(1, [100, 101, 102, 103, 104]), (2, [106, 107, 108])]]
    assert gkd.prompts_of(dict(batch, weights=w * (seg == 1))) == [[(1, [100, 101, 102, 103, 104])]]


def test_an_off_policy_step_trains_the_data_batch(cache_dir):
    cfg = gkd_cfg(cache_dir, on_policy=0.5, max_new_tokens=6)
    task, params, data = student(cfg)
    step = next(s for s in range(50) if not gkd.chosen(cfg.train.seed, s, 0.5))
    out, host = task.rollout(params, data.train(step), step, data)
    for k, v in data.train(step).items():
        np.testing.assert_array_equal(out[k], v)
    np.testing.assert_array_equal(out["on_policy"], np.zeros(8, np.float32))
    assert host == {"gkd_steps": 1.0, "on_policy_steps": 0.0}


def test_the_steps_chosen_are_a_function_of_seed_and_step():
    picks = [gkd.chosen(0, s, 0.3) for s in range(4000)]
    assert picks == [gkd.chosen(0, s, 0.3) for s in range(4000)]
    assert abs(np.mean(picks) - 0.3) < 0.03
    assert picks != [gkd.chosen(1, s, 0.3) for s in range(4000)]
    assert not any(gkd.chosen(0, s, 0.0) for s in range(200)) and all(gkd.chosen(0, s, 1.0) for s in range(200))


def test_a_resumed_run_reproduces_an_uninterrupted_one(cache_dir, teacher_run, tmp_path):
    cfg = gkd_cfg(cache_dir, teacher_run, steps=4, on_policy=0.5, max_new_tokens=6)
    assert {gkd.chosen(cfg.train.seed, s, 0.5) for s in range(4)} == {True, False}  # both kinds of step
    whole = run(cfg, tmp_path / "whole", quiet=True)
    run(cfg, tmp_path / "split", quiet=True, stop_at_step=2)
    split = run(cfg, tmp_path / "split", quiet=True, resume=True)
    for x, y in zip(jax.tree.leaves(whole["params"]), jax.tree.leaves(split["params"])):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    shares = {r["step"]: r["on_policy_share"] for r in whole["records"]}
    assert shares == {s + 1: float(gkd.chosen(cfg.train.seed, s, 0.5)) for s in range(4)}
    assert all(r["sample_length"] > 0 for r in whole["records"] if r["on_policy_share"])
    assert [r["loss"] for r in split["records"]] == [r["loss"] for r in whole["records"]][2:]


def test_the_loss_of_sampled_rows_is_trls_generalized_jsd_alone(cache_dir):
    torch = pytest.importorskip("torch")
    trl_gkd = pytest.importorskip("trl.experimental.gkd.gkd_trainer", reason="trl is not installed: the GKD parity "
                                                                            "test runs TRL's generalized_jsd_loss")
    cfg = gkd_cfg(cache_dir, on_policy=1.0, max_new_tokens=8, sample_temperature=1.0, alpha=0.3, beta=0.5)
    task, params, data = student(cfg)
    task.teacher.model = task.model  # a teacher of the student's shape, its own weights
    teacher = nn.unbox(task.init(jax.random.PRNGKey(1)))
    out, _ = task.rollout(params, data.train(0), 0, data)
    batch = jax.tree.map(jnp.asarray, out)
    packed = {"positions_BT": batch["positions"], "segment_ids_BT": batch["segment_ids"]}
    z, u = (np.asarray(task.teacher.logits(p, batch["inputs"], **packed)) for p in (params, teacher))
    labels = np.where(out["weights"] > 0, out["targets"], -100)
    want = trl_gkd.GKDTrainer.generalized_jsd_loss(torch.tensor(z), torch.tensor(u), labels=torch.tensor(labels),
                                                   beta=0.5, temperature=1.0, reduction="sum")
    loss, aux = task.loss(params, batch, jax.random.PRNGKey(0), True, teacher=teacher)
    assert float(aux["weight"]) == (labels != -100).sum() > 0
    np.testing.assert_allclose(float(loss), float(want), rtol=2e-5)
    # the same rows flagged as data mix in alpha's cross-entropy: the flag is what drops it
    mixed, aux = task.loss(params, {**batch, "on_policy": jnp.zeros(8)}, jax.random.PRNGKey(0), True, teacher=teacher)
    np.testing.assert_allclose(float(mixed), 0.3 * float(aux["kl_sum"]) + 0.7 * float(aux["ce_sum"]), rtol=1e-5)
    assert abs(float(mixed) - float(loss)) > 1e-2 * float(loss)


@pytest.mark.parametrize("change, message", [
    (dict(task="gpt_lm"), r"^distill.on_policy=0.5 samples answers to task=sft's prompts; task='gpt_lm' has none"),
    (dict(teacher=""), r"^distill.on_policy=0.5 distils the student's own answers against a teacher; set "
                       r"distill.teacher"),
    (dict(train_on_prompt=True), r"^distill.on_policy=0.5 answers each example's prompt, which "
                                 r"data.train_on_prompt=true leaves unmarked"),
    (dict(on_policy=1.5), r"^distill.on_policy=1.5 must be in \[0, 1\]"),
    (dict(on_policy=-0.1), r"^distill.on_policy=-0.1 must be in \[0, 1\]"),
    (dict(max_new_tokens=0), r"^distill.max_new_tokens=0 must be an integer >= 1$"),
    (dict(sample_temperature=-1.0), r"^distill.sample_temperature=-1.0 must be a finite number >= 0"),
])
def test_bad_settings_are_one_line_naming_the_key(cache_dir, change, message):
    cfg = gkd_cfg(cache_dir)
    with pytest.raises(ConfigError, match=message) as e:
        distill = {k: v for k, v in change.items() if k in ("teacher", "on_policy", "max_new_tokens",
                                                            "sample_temperature")}
        d = dataclasses.replace(cfg.data, train_on_prompt=change.get("train_on_prompt", False))
        dataclasses.replace(cfg, task=change.get("task", "sft"), data=d,
                            distill=DistillConfig(**{"teacher": "gpt_tiny", "on_policy": 0.5, **distill}))
    assert "\n" not in str(e.value)
