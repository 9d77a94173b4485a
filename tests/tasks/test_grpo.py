"""Reinforcement learning from rewards (task=grpo): advantages are normalised within each prompt's group; a LoRA
run's first step is the plain policy gradient (ratio 1, KL 0 against its base with the adapters off), whatever the
averaging; the in-loop sampler at temperature 0 is zoo.load(...).generate and .chat; zoo's own rewards and
arithmetic set say what they promise; bad rewards and settings end in one line and leave no workdir.
(TRL parity: test_grpo_trl.py; 8 devices = 1 and resume bit for bit: tests/train/test_invariants.py.)"""

import dataclasses
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from tests.helpers import tiny_configs
from tests.helpers.runs import run, write_jsonl
from zoo import rewards, tasks
from zoo.cli.train import train_main
from zoo.configuration import OptimConfig
from zoo.data import arithmetic, chat
from zoo.errors import ConfigError, TrainError
from zoo.tasks import rl
from zoo.training import checkpoint, runs


@pytest.fixture(scope="module")
def base(tmp_path_factory, cache_dir):
    """A tiny GPT trained 6 steps (no dropout): the base the GRPO runs start from."""
    work = tmp_path_factory.mktemp("grpo-base") / "run"
    cfg = tiny_configs.gpt_lm(cache_dir)
    run(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dropout=0.0)), work, devices=jax.devices()[:1])
    return str(work)


def grpo_cfg(base, cache_dir, lora_rank=4, **grpo):
    cfg = tiny_configs.grpo(cache_dir)
    m = dataclasses.replace(runs.load_config(base).model, lora_rank=lora_rank, lora_alpha=8.0)
    g = dataclasses.replace(cfg.grpo, **{"beta": 0.04 if lora_rank else 0.0, **grpo})
    return dataclasses.replace(cfg, model=m, init_from=base, grpo=g, optim=OptimConfig(lr=1e-2, warmup=0),
                               train=dataclasses.replace(cfg.train, steps=3, log_every=1, eval_every=3, save_every=3))


@pytest.fixture(scope="module")
def lora_run(base, tmp_path_factory, cache_dir):
    cfg = grpo_cfg(base, cache_dir)
    work = tmp_path_factory.mktemp("grpo") / "lora"
    return cfg, str(work), run(cfg, work, devices=jax.devices()[:1])


def test_advantages_are_normalised_within_each_group():
    r = np.asarray([1, 0, 0, 0, 2, 2, 2, 2, 0.5, 1.5, 1, 1], np.float32)
    adv = rl.group_advantages(r, 4)
    first = (r[:4] - r[:4].mean()) / (r[:4].std(ddof=1) + 1e-4)
    np.testing.assert_allclose(adv[:4], first, rtol=1e-6)
    assert adv[0] > 0 > adv[1] and np.all(adv[4:8] == 0)  # one group better, one where all tie: no signal
    np.testing.assert_allclose(adv.reshape(3, 4).sum(1), 0, atol=1e-5)
    # the logged figures (TRL 1.16's): reward_std the step's whole batch's, averaged over the steps logged;
    # frac_reward_zero_std the completions of groups that tie (their advantage 0)
    two = [rl.reward_sums(r, r[:, None], ["f"], 4), rl.reward_sums(r[::-1] * 2, r[:, None], ["f"], 4)]
    got = rl.GrpoTask.train_metrics(None, {k: two[0][k] + two[1][k] for k in two[0]})
    assert got["reward_std"] == pytest.approx((r.std(ddof=1) + (2 * r).std(ddof=1)) / 2, rel=1e-6)
    assert got["frac_reward_zero_std"] == pytest.approx(1 / 3) and got["reward"] == pytest.approx(1.5 * r.mean())


def test_a_lora_runs_first_step_is_the_policy_gradient_at_kl_zero(lora_run, base, cache_dir):
    cfg, work, out = lora_run
    first, last = out["records"][0], out["records"][-1]
    assert first["kl"] == pytest.approx(0, abs=1e-7) and first["clip_ratio"] == 0  # adapters at zero: the base
    assert last["kl"] > 1e-6  # the adapters moved the policy away from its reference
    # The first step's batch, sampled again from the base (what the policy is before any step).
    plain_cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, lora_rank=0), grpo=dataclasses.replace(
        cfg.grpo, beta=0.0))
    plain = tasks.build(plain_cfg)
    data = plain.make_data(plain_cfg, 0, 1)
    batch, host = plain.rollout(runs.load_params_of(base, runs.load_config(base)), data.train(0), 0, data)
    n_R = batch["weights"].sum(1)
    assert first["loss"] == pytest.approx(-(batch["advantages"] * n_R).sum() / n_R.sum(), abs=1e-6)
    assert first["reward"] == pytest.approx(host["reward_sum"] / len(n_R), rel=1e-6)
    assert first["completion_length"] == pytest.approx(n_R.mean(), rel=1e-6)
    for key in ("reward_std", "rewards/digits", "gen_seconds", "seconds"):
        assert key in first, key
    assert "accuracy" not in first and "eval_reward" in last and "eval_rewards/digits" in last


@pytest.mark.parametrize("loss_type", ["bnpo", "grpo", "dr_grpo"])
def test_each_averaging_is_its_formula_and_its_gradient_the_policy_gradient(base, cache_dir, loss_type):
    cfg = grpo_cfg(base, cache_dir, lora_rank=0, loss_type=loss_type)
    task = tasks.build(cfg)
    data = task.make_data(cfg, 0, 1)
    params = runs.load_params_of(base, runs.load_config(base))
    batch, _ = task.rollout(params, data.train(0), 0, data)
    batch = jax.tree.map(jnp.asarray, batch)
    w_RT, a_R = batch["weights"], batch["advantages"]
    n_R = w_RT.sum(1)
    rng = jax.random.PRNGKey(0)

    def loss(p):
        loss_sum, aux = task.loss(p, batch, rng, True)
        return loss_sum / aux["weight"]

    def surrogate(p):  # the policy gradient objective, averaged the same way
        lp_RT = task.token_logps(p, batch, True, rng)[0]
        per_R = -(a_R[:, None] * lp_RT * w_RT).sum(1)
        return {"bnpo": per_R.sum() / n_R.sum(), "grpo": (per_R / n_R).mean(),
                "dr_grpo": per_R.sum() / (len(n_R) * cfg.grpo.max_completion_tokens)}[loss_type]

    want = {"bnpo": -(a_R * n_R).sum() / n_R.sum(), "grpo": -a_R.mean(),
            "dr_grpo": -(a_R * n_R).sum() / (len(n_R) * cfg.grpo.max_completion_tokens)}[loss_type]
    assert float(loss(params)) == pytest.approx(float(want), abs=1e-6)
    g, g_want = jax.grad(loss)(params), jax.grad(surrogate)(params)
    assert max(float(jnp.abs(x).max()) for x in jax.tree.leaves(g)) > 1e-4
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_want)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


def test_temperature_zero_samples_what_zoo_load_generates_and_chats(lora_run):
    cfg, work, out = lora_run
    task, params = out["setup"].task, out["setup"].full_params(out["state"])
    lm = zoo.load(work)
    tok = lm.tokenizer
    prompts = ["3+4=", "12+9=", "7+7=", "1+2="]
    got = task.complete(params, [tok.encode(p) for p in prompts], tok, seed=0, temperature=0.0)[0]
    assert [tok.decode(c) for c in got] == lm.generate(prompts, max_new_tokens=cfg.grpo.max_completion_tokens)
    # A conversational source: the prompt rendered with the run's chat template, as chat() renders it.
    conv = [[{"role": "user", "content": p}] for p in prompts]
    with open(os.path.join(work, "chat_template.jinja")) as f:
        template = f.read()
    ids = [tok.encode_with_offsets(chat.render(template, c, add_generation_prompt=True,
                                               variables=chat.specials(tok, cfg.data.tokenizer)))[0] for c in conv]
    short = tasks.build(dataclasses.replace(cfg, grpo=dataclasses.replace(cfg.grpo, max_completion_tokens=3)))
    got = short.complete(params, ids, tok, seed=0, temperature=0.0)[0]  # the template leaves 3 of 32 tokens
    assert [tok.decode(c) for c in got] == lm.chat(conv, max_new_tokens=3)
    assert lm.chat(prompts, max_new_tokens=3) == lm.chat(conv, max_new_tokens=3)  # user messages: one batch too


def test_a_chat_source_passes_its_columns_and_messages_to_the_rewards(base, tmp_path, cache_dir):
    rows = [{"prompt": [{"role": "user", "content": f"{a % 10}+1"}], "answer": str(a % 10 + 1), "level": a % 3}
            for a in range(12)]
    path = write_jsonl(tmp_path / "chat.jsonl", rows)
    seen = {}

    def spy(prompts, completions, answer, level, **columns):
        seen.update(prompts=prompts, completions=completions, answer=answer, level=level)
        return [1.0] * len(completions)

    cfg = grpo_cfg(base, cache_dir, lora_rank=0, num_generations=2, max_completion_tokens=3)  # the template: 28
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, source=path))
    task = tasks.build(cfg)
    task.rewards = [("spy", spy)]
    data = task.make_data(cfg, 0, 1)
    batch, host = task.rollout(runs.load_params_of(base, runs.load_config(base)), data.train(0), 0, data)
    pool = data.examples["train"]
    index = [pool.where[int(i)] for i in data.train(0)["index"] for _ in range(2)]  # rows of the source
    assert seen["prompts"] == [rows[i]["prompt"] for i in index]
    assert seen["answer"] == [rows[i]["answer"] for i in index] and seen["level"] == [rows[i]["level"] for i in index]
    assert all(c[0]["role"] == "assistant" and isinstance(c[0]["content"], str) for c in seen["completions"])
    assert host["reward_sum"] == len(index) and np.all(batch["advantages"] == 0)


def test_a_reward_that_cannot_take_a_chat_sources_completions_fails_before_anything_compiles(base, tmp_path,
                                                                                           cache_dir):
    """A reward written for strings, on a source of conversations (its completions are message lists): one line
    from make_data, which runs before the step compiles, saying what a completion is."""
    import re
    rows = [{"prompt": [{"role": "user", "content": f"{a % 10}+1"}], "answer": str(a % 10 + 1)} for a in range(12)]
    path = write_jsonl(tmp_path / "chat.jsonl", rows)

    def strings(prompts, completions, answer, **columns):
        return [float(re.search(r"\d+", c) is not None) for c in completions]

    cfg = grpo_cfg(base, cache_dir, lora_rank=0, num_generations=2, max_completion_tokens=3)
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, source=path))
    task = tasks.build(cfg)
    task.rewards = [("strings", strings)]
    with pytest.raises(TrainError) as e:
        task.make_data(cfg, 0, 1)
    assert str(e.value).startswith("reward strings raised TypeError: expected string or bytes-like object")
    assert str(e.value).endswith("tried before compiling, on an empty completion: each completion a reward gets is a "
                                 "list of one message, [{'role': 'assistant', 'content': TEXT}] (TRL's convention for "
                                 "a source of conversations)")


def test_zoos_rewards_and_arithmetic_set():
    done = [[{"role": "assistant", "content": "12 + 30 = 42. The answer is 42."}]]
    assert rewards.exact_answer([None], done, answer=["42"]) == [1.0]
    assert rewards.answer_format([None], done) == [1.0]
    texts = ["42", "The answer is 41", "The answer is 42.0.", "no number", "The answer is 42. Anything else?"]
    assert rewards.exact_answer([None] * 5, texts, answer=["42"] * 5) == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert rewards.answer_format([None] * 5, texts) == [0.0, 0.5, 1.0, 0.0, 0.5]
    rows = arithmetic.rows()
    assert len(rows) == 400 and len({r["prompt"][1]["content"] for r in rows}) == 400
    for r in rows[:50]:
        a, op, b = r["prompt"][1]["content"][len("What is "):-1].split()
        assert int(r["answer"]) == (int(a) + int(b) if op == "+" else int(a) - int(b))


BAD_REWARDS = '''
def raises(prompts, completions, **columns):
    return [1 / (len(c) - len(c)) if "3" in p else 0.0 for p, c in zip(prompts, completions)]
def one_short(prompts, completions, **columns):
    return [0.0] * (len(completions) - 1)
def nan(prompts, completions, **columns):
    return [float("nan")] * len(completions)
'''

BAD = [  # (what, --set, the error's piece)
    ("a reward that raises", ["grpo.rewards=BAD:raises"],
     "reward raises raised ZeroDivisionError: division by zero on row "),
    ("a reward of the wrong length", ["grpo.rewards=BAD:one_short"],  # found before compiling (try_rewards)
     "reward one_short returned 0 values for 1 completions; tried before compiling, on an empty completion"),
    ("a NaN reward", ["grpo.rewards=BAD:nan"], "reward nan returned nan for row "),
    ("a reward not in its file", ["grpo.rewards=BAD:absent"], "has no function 'absent'"),
    ("a reward module not found", ["grpo.rewards=no_such_module:f"], "'no_such_module' does not load"),
    ("a reward file not found", ["grpo.rewards=/no/such/file.py:f"], "'/no/such/file.py' does not load"),
    ("G < 2", ["grpo.num_generations=1"], "grpo.num_generations=1 must be >= 2"),
    ("no room for a completion", ["grpo.max_completion_tokens=32"],
     "grpo.max_completion_tokens=32 leaves no room for a prompt"),
    ("a prompt with no room left", ["grpo.max_completion_tokens=30"], "row 0's prompt is 4 tokens"),
    ("a KL penalty without a reference", ["model.lora_rank=0", "grpo.beta=0.04"],
     "grpo.beta=0.04 penalises the distance to a reference"),
    ("weights for other rewards", ["grpo.reward_weights=1"], "grpo.reward_weights='1' has 1 number(s) for the 2"),
]


def small_run(base, tmp_path, sets, rewards=BAD_REWARDS) -> list[str]:
    """train.py's arguments of a 2-step LoRA GRPO run on 16 sums, `rewards` in the file BAD, with `sets`."""
    bad = tmp_path / "bad_rewards.py"
    bad.write_text(rewards)
    path = write_jsonl(tmp_path / "sums.jsonl", tiny_configs.sums(16))
    return ["--init-from", base, "--workdir", str(tmp_path / "w"), "--set", "task=grpo", "--set",
            f"data.source={path}", "--set", "data.seq_len=32", "--set", "model.lora_rank=4", "--set",
            "grpo.num_generations=2", "--set", "grpo.max_completion_tokens=4", "--set", "train.batch_size=8",
            "--set", "train.steps=2", *[a for s in sets for a in ("--set", s.replace("BAD", str(bad)))]]


@pytest.mark.parametrize("what, sets, piece", BAD, ids=[b[0] for b in BAD])
def test_bad_rewards_and_settings_are_one_line_and_leave_nothing(base, tmp_path, capsys, cache_dir, what, sets, piece):
    assert train_main(small_run(base, tmp_path, sets)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and piece in err[0], err
    assert not os.path.exists(tmp_path / "w")


def test_rewards_that_misbehave_are_one_line_naming_the_function_and_the_row(tmp_path):
    """A reward that calls sys.exit (at import or on a row), returns strings, None or numbers past float32, or is
    not a list: one line naming the reward and the row, nothing coerced; bools and numpy / jax scalars are numbers;
    a KeyboardInterrupt comes out as RewardInterrupt (the trainer stops as on Ctrl-C)."""
    exits = tmp_path / "exits.py"
    exits.write_text("import sys\nsys.exit(0)\ndef f(prompts, completions, **c):\n    return [0.0] * len(prompts)\n")
    with pytest.raises(ConfigError, match=rf"grpo.rewards: '{exits}' does not load \(it called sys.exit\(0\) at "):
        rl.load_rewards(dataclasses.replace(tiny_configs.grpo(str(tmp_path)).grpo, rewards=f"{exits}:f"))
    prompts, completions, where = ["1+1=", "3+3=", "2+2="], ["a", "b", "c"], [7, 8, 9]

    def call(fn):
        return rl.call_reward("r", lambda p, c, **k: fn(p, c), prompts, completions, {}, where)

    def refused(fn, piece):
        with pytest.raises(TrainError) as e:
            call(fn)
        assert piece in str(e.value) and "\n" not in str(e.value), str(e.value)

    refused(lambda p, c: [sys.exit(3) if "3" in q else 0.0 for q in p], "reward r called sys.exit(3) on row 8 of")
    refused(lambda p, c: ["1.0"] * len(c), "reward r returned '1.0' (str) for row 7 of the source; a reward must be")
    refused(lambda p, c: "111", "reward r returned str '111', not a list of numbers")
    refused(lambda p, c: [0.0, None, 1.0], "reward r returned None (NoneType) for row 8")
    refused(lambda p, c: [0.0, 0.0, 1e300], "reward r returned 1e+300 for row 9 of the source; a reward must be a "
                                            "finite number within float32's range")
    refused(lambda p, c: [0.0, -4e38, 0.0], "returned -4e+38 for row 8")
    refused(lambda p, c: [float("inf")] * 3, "returned inf for row 7")
    got = call(lambda p, c: [True, np.float32(0.5), jnp.asarray(2.0)])
    assert got.tolist() == [1.0, 0.5, 2.0] and got.dtype == np.float64
    with pytest.raises(rl.RewardInterrupt, match="a KeyboardInterrupt in reward r"):
        call(lambda p, c: (_ for _ in ()).throw(KeyboardInterrupt()))


def test_a_keyboard_interrupt_in_a_reward_stops_the_run_as_ctrl_c_does(base, tmp_path, capsys):
    """A reward raising KeyboardInterrupt: a checkpoint and one line naming it, no traceback, exit 0 (Ctrl-C's)."""
    rewards = "def interrupts(prompts, completions, **columns):\n    raise KeyboardInterrupt\n"
    assert train_main(small_run(base, tmp_path, ["grpo.rewards=BAD:interrupts"], rewards)) == 0
    out, err = capsys.readouterr()
    work = str(tmp_path / "w")
    assert (f"stopped by a KeyboardInterrupt in reward interrupts at step 0; checkpoint saved. Continue with: "
            f"python train.py --resume {work}") in out.splitlines(), out
    assert "Traceback" not in err and checkpoint.all_steps(work) == [0]


def test_zoo_train_is_the_python_call_of_a_grpo_run(base, tmp_path, cache_dir):
    """zoo.train runs task=grpo as train.py does (README: "the same call"), its Run carrying the reward metrics,
    and the run it leaves loads and generates."""
    cfg = grpo_cfg(base, cache_dir)
    out = zoo.train(cfg, workdir=str(tmp_path / "py"), overrides={"train.steps": 2, "train.eval_every": 2},
                    devices=jax.devices()[:1], quiet=True)
    assert out.step == 2 and {"reward", "kl", "rewards/digits", "eval_reward"} <= set(out.metrics), out.metrics
    assert isinstance(out.load().generate("1+2=", max_new_tokens=2), str)
