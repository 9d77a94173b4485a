"""The watch over RL and preference runs (zoo.training.objective_watch, issue #54): the user's collapsed GRPO run (reward
1.375 -> 2.0 -> 0.875 -> 0.0, KL 0.15 -> 5.07 -> 9.95 nats a token, every completion at the cap) and DPO run (chosen
-3.5 -> -7.3 nats while the margin rose) are each warned of in one line naming the metric and what to try, calm runs
are not; the checkpoint whose params sampled the best reward survives train.keep's rotation and is named at the
end; a DPO validation split of fewer than 4 pairs is refused where the set could hold out more, and the held-out
preference of the initial model is said before the first step."""

import dataclasses

import flax.linen as nn
import jax
import numpy as np
import pytest

from tests.helpers import tiny_configs
from tests.helpers.runs import run, write_jsonl
from zoo import tasks
from zoo.configuration import PreferenceConfig
from zoo.errors import ConfigError
from zoo.tasks import preference
from zoo.training import checkpoint, checkpoint_manager, objective_watch


def watched(watch, records: list[dict]) -> list[str]:
    return [line for step, r in enumerate(records, 1) for line in watch.check(step, r)]


def grpo_records(rewards, kls, capped):
    return [{"reward": r, "kl": k, "completions/clipped_ratio": c} for r, k, c in zip(rewards, kls, capped)]


USER_GRPO = grpo_records([1.375, 1.625, 1.75, 2.0, 0.875, 0.0, 0.0, 0.0], [0.15, 0.4, 1.2, 2.6, 5.07, 7.3, 9.95, 9.95],
                         [0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0])


def test_the_users_collapsed_grpo_run_is_warned_of_by_reward_kl_and_length(capsys):
    lines = watched(objective_watch.RewardWatch(), USER_GRPO)
    assert [ln.split(": ", 2)[0] for ln in lines] == ["warning"] * 3 and len(lines) == 3
    by = {w: next(ln for ln in lines if w in ln) for w in ("mean reward", "KL", "grpo.max_completion_tokens")}
    assert by["mean reward"].startswith("warning: step 6: the mean reward collapsed from its best 2 (step 4) to 0")
    assert "under its start 1.375" in by["mean reward"] and "lower optim.lr" in by["mean reward"]
    assert by["KL"].startswith("warning: step 4: the KL to the reference is 2.6 nats a completion token, over 1")
    assert "higher grpo.beta" in by["KL"]
    assert by["grpo.max_completion_tokens"].startswith("warning: step 5: 100% of the completions reached")
    assert capsys.readouterr().err.splitlines() == lines  # said on stderr, one line each, once
    assert len(watched(objective_watch.RewardWatch(main=False), USER_GRPO)) == 3  # process 0 alone prints them
    assert capsys.readouterr().err == ""


CALM_GRPO = [
    # the shipped config's 5-step means, a dip, KL of a beta=0.04 run, a few completions at the cap
    grpo_records([0.12, 0.38, 0.93, 1.05, 0.95, 1.11, 1.23], [0.0, 0.02, 0.05, 0.08, 0.1, 0.09, 0.11],
                 [0.1, 0.05, 0.0, 0.0, 0.1, 0.0, 0.0]),
    # noisy and flat, one record over every bound (a single noisy batch is not a trend), a cap too short throughout
    grpo_records([0.5, 0.9, 0.3, 0.6, 0.7, 0.2, 0.8], [0.1, 1.5, 0.2, 0.1, 0.3, 0.2, 0.1], [1.0] * 7),
    # rewards under 0 that rise and stay
    grpo_records([-2.0, -1.5, -1.0, -0.5, -0.6, -0.4, -0.5], [0.0] * 7, [0.0] * 7),
]


@pytest.mark.parametrize("records", CALM_GRPO, ids=["shipped", "noisy", "negative"])
def test_calm_grpo_runs_are_not_warned_of(records, capsys):
    assert watched(objective_watch.RewardWatch(), records) == []
    assert capsys.readouterr().err == ""


def test_a_negative_reward_that_falls_back_past_its_start_is_a_collapse():
    lines = watched(objective_watch.RewardWatch(False), grpo_records([-1.0, -0.5, 0.0, -2.5, -3.0], [0] * 5, [0] * 5))
    assert len(lines) == 1 and lines[0].startswith("warning: step 5: the mean reward collapsed from its best 0")


def dpo_records(chosen, margins):
    return [{"logps/chosen": c, "rewards/margins": m} for c, m in zip(chosen, margins)]


def test_the_users_dpo_run_pushing_the_chosen_answers_down_is_warned_of_and_a_calm_one_is_not(capsys):
    lines = watched(objective_watch.PreferenceWatch(), dpo_records([-3.5, -4.2, -5.4, -6.6, -7.3],
                                                                   [0.0, 0.3, 0.9, 1.6, 2.1]))
    assert len(lines) == 1 and lines[0].startswith("warning: step 5: the chosen answers' log-probability fell 3.8 "
                                                   "nats (-3.5 -> -4.2 -> -5.4 -> -6.6 -> -7.3) while the margin rose "
                                                   "(0 -> 2.1)")
    assert "dpo.beta" in lines[0] and capsys.readouterr().err.splitlines() == lines
    calm = [dpo_records([-3.5, -3.2, -3.0, -2.9], [0.0, 0.4, 0.9, 1.3]),  # chosen up, margin up: as meant
            dpo_records([-3.5, -5.8, -4.0, -6.0], [0.0, 0.5, 0.6, 0.7]),  # one noisy batch under the bound
            dpo_records([-3.5, -6.0, -7.0, -8.0], [0.0, -0.1, -0.3, -0.5]),  # both down, the margin too: no gain
            # long answers (the shipped config's): summed over ~100 tokens, a healthy run's small drop per token
            dpo_records([-60.0, -63.0, -68.0, -74.0], [0.0, 10.0, 30.0, 60.0])]
    assert [watched(objective_watch.PreferenceWatch(), r) for r in calm] == [[], [], [], []]


def test_the_watch_follows_the_tasks_watch_name():
    cfg = tiny_configs.grpo("/tmp")
    assert type(objective_watch.of(tasks.build(cfg))) is objective_watch.RewardWatch
    assert type(objective_watch.of(tasks.build(tiny_configs.dpo("/tmp")))) is objective_watch.PreferenceWatch
    assert type(objective_watch.of(tasks.build(tiny_configs.gpt_lm("/tmp")))) is objective_watch.Watch


STEP_REWARDS = [0.5, 3.0, 0.0, 0.0]  # the rollout of step i + 1 scored STEP_REWARDS[i]: step 2's the best

REWARD_FILE = '''
import os
STEPS = {steps}
COUNT = {count!r}
def by_step(prompts, completions, **columns):
    if len(completions) != 16:  # the check before compiling (1 completion), held-out prompts: not a rollout
        return [0.0] * len(completions)
    n = int(open(COUNT).read()) if os.path.exists(COUNT) else 0
    open(COUNT, "w").write(str(n + 1))
    return [STEPS[min(n, len(STEPS) - 1)]] * len(completions)
'''


def test_the_checkpoint_that_sampled_the_best_reward_survives_rotation_and_is_named(tmp_path, cache_dir, capsys):
    reward = tmp_path / "by_step.py"
    reward.write_text(REWARD_FILE.format(steps=STEP_REWARDS, count=str(tmp_path / "count")))
    cfg = tiny_configs.grpo(cache_dir)
    cfg = dataclasses.replace(cfg, grpo=dataclasses.replace(cfg.grpo, rewards=f"{reward}:by_step"),
                              train=dataclasses.replace(cfg.train, steps=4, log_every=1, save_every=1, keep=1,
                                                        eval_every=0))
    work = tmp_path / "run"
    run(cfg, work, devices=jax.devices()[:1])
    out, err = capsys.readouterr()
    assert "for the 2 steps left" in out  # a rollout's step 1 compiles the sampler too: timed from step 2
    # step 2's rollout (reward 3) was sampled by checkpoint 1's params: kept though keep=1 rotated 2 and 3 out
    assert 1 in checkpoint.all_steps(str(work)) and 4 in checkpoint.all_steps(str(work))
    assert not {2, 3} & set(checkpoint.all_steps(str(work))) - {checkpoint.last_good(str(work))}
    assert checkpoint_manager.best_reward(str(work)) == (1, 3.0)
    assert "warning: step 4: the mean reward collapsed from its best 3 (step 2) to 0, under its start 0.5" in err
    assert (f"warning: the mean reward collapsed; best training reward 3 (the last 0) was sampled from the params "
            f"of step 1: {checkpoint.step_dir(str(work), 1)}, kept whatever train.keep rotates out") in err
    with checkpoint.manager(str(work), keep=1) as m:  # a resumed run's manager keeps it too
        assert (m.zoo_policy.best, m.zoo_policy.best_value) == (1, 3.0)
        checkpoint.prune(m, 1)
    assert 1 in checkpoint.all_steps(str(work))


def warnings(capsys) -> list[str]:
    """The warning lines on stderr (the datasets library draws its own progress there)."""
    return [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("warning")]


def test_a_small_dpo_validation_split_is_refused_where_the_set_could_hold_out_more(cache_dir, tmp_path, capsys):
    cfg = tiny_configs.dpo(cache_dir)  # 48 pairs
    small = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, val_fraction=0.02))
    with pytest.raises(ConfigError, match=r"^data.val_fraction=0.02 holds out [1-3] of the 48 preference pairs; a "
                                          r"held-out accuracy over fewer than 4 pairs .*: set data.val_fraction >= "
                                          r"0.17 \(at least 4 pairs\)$"):
        tasks.build(small).make_data(small, 0, 1)
    # a set too small to hold out 4 and still train on 16: warned of
    few = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, source=write_jsonl(
        tmp_path / "few.jsonl", tiny_configs.preference_pairs(10))))
    data = tasks.build(few).make_data(few, 0, 1)
    err = warnings(capsys)
    assert len(err) == 1 and err[0].startswith(f"warning: data.val_fraction=0.2 holds out {len(data.examples['eval'])}"
                                               f" of the 10 preference pairs")
    assert len(tasks.build(cfg).make_data(cfg, 0, 1).examples["eval"]) >= 4 and not warnings(capsys)


def test_the_initial_models_held_out_preference_is_said_before_the_first_step(cache_dir, tmp_path, capsys):
    cfg = dataclasses.replace(tiny_configs.dpo(cache_dir), dpo=PreferenceConfig(loss="simpo"))  # no reference to compute
    task = tasks.build(cfg)
    data = task.make_data(cfg, 0, 1)
    params = nn.unbox(task.init(jax.random.PRNGKey(0)))
    capsys.readouterr()
    task.prepare(params, data, str(tmp_path), False, None)
    val = data.examples["eval"]
    lp = np.asarray(task.logps(params, val.rows(np.arange(len(val))), False, jax.random.PRNGKey(0))[0])
    won = int((lp[:, 0] > lp[:, 1]).sum())
    assert capsys.readouterr().out.strip() == (f"before training: chosen preferred in {won}/{len(val)} held-out pairs, "
                                               f"mean log-prob margin {np.mean(lp[:, 0] - lp[:, 1]):+.2f}")
    assert preference.held_out_line(np.array([[-1.0, -3.0], [-2.0, -2.5]])) == (
        "before training: chosen preferred in 2/2 held-out pairs, mean log-prob margin +1.25 (all already preferred: "
        "DPO can only widen their margins; watch logps/chosen)")
    task.prepare(params, data, str(tmp_path), True, None)  # a resume: not before training
    assert capsys.readouterr().out == ""
