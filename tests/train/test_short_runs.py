"""A small set's fine-tune is long enough to teach (issue #54): epochs of a packed set make at least
sizing.MIN_UPDATES updates, never more than the same epochs unpacked; a run without packing (every pretraining
config) keeps its steps; a short run logs as it goes and says the time left from its first step (its compile
apart; a rollout's from the second); the first step says what compiled and what it cost; a fine-tune too short or too hot is told so in one line naming the settings."""

import dataclasses
import json
import math
import re

from conftest import replace
from tests.helpers.runs import write_jsonl
from tests.tasks.test_sft_task import CHATS, sft_cfg
from zoo.configuration import Config, OptimConfig, TrainConfig
from zoo.models.gpt import GptConfig
from zoo.tasks import sft
from zoo.training import sizing, trainer

RECIPE = TrainConfig(epochs=3, batch_size=8, log_every=10)  # the fine-tuning defaults (zoo.api.fine_tune.FINE_TUNE)


def steps(chats: int, per_row: int = 4) -> int:
    cfg = Config(train=RECIPE)
    return sizing.steps_of_epochs(cfg, math.ceil(chats / per_row), False, chats).train.steps


def test_small_packed_sets_get_the_updates_an_unpacked_run_would_up_to_the_floor():
    # 60 chats, 4 a row: 15 rows, 6 packed steps before; 3 x 60 / 8 = 23 unpacked updates now.
    assert (steps(60), steps(200), steps(1000)) == (23, 30, 94)
    assert steps(8) == 3  # 3 epochs of 8 chats are 3 updates unpacked: never more than that
    assert steps(1000) == math.ceil(3 * 250 / 8)  # a large set: epochs of its packed rows, as before


def test_a_run_without_packing_keeps_its_steps_and_explicit_steps_win():
    cfg = Config(train=RECIPE)
    assert sizing.steps_of_epochs(cfg, 15, False).train.steps == 6  # one example a row (pretraining): unchanged
    assert sizing.steps_of_epochs(cfg, 15, False, 15).train.steps == 6
    given = Config(train=TrainConfig(steps=7, batch_size=8))  # epochs 0: train.steps as given, log_every too
    assert sizing.steps_of_epochs(given, 15, False, 60) is given


def test_a_short_run_logs_about_ten_times_and_says_so(capsys):
    cfg = sizing.steps_of_epochs(Config(train=RECIPE), 15, True, 60)
    assert (cfg.train.steps, cfg.train.log_every) == (23, 2)
    line = capsys.readouterr().out.strip()
    assert line.startswith("train.epochs=3: 23 steps of 8 rows over 15 training rows (60 examples packed; ")
    assert "packed rows would be 6 steps" in line and "unpacked would (23), up to 30: each row drawn about 12.3 times" \
        in line
    assert line.endswith("a line every 2 steps (train.log_every=2)")
    long = sizing.steps_of_epochs(Config(train=RECIPE), 1000, False)
    assert (long.train.steps, long.train.log_every) == (375, 10)  # never raised


def fine_tune(lr=2e-4, lora=16, steps=23, batch=8):
    return Config(init_from="/runs/base", model=GptConfig(lora_rank=lora), optim=OptimConfig(lr=lr),
                  train=TrainConfig(steps=steps, batch_size=batch))


def test_a_fine_tune_too_short_or_too_hot_is_told_which_settings_to_change():
    short = sizing.size_warning(fine_tune(steps=6), 15)
    assert short.startswith("warning: this fine-tune makes only 6 optimizer steps") and "train.steps=30" in short
    assert sizing.size_warning(fine_tune(steps=23), 15) is None  # the recipe on 60 chats, after the fix
    full = sizing.size_warning(fine_tune(lr=2e-4, lora=0, steps=100), 1000)
    assert "optim.lr=0.0002 is high for a full fine-tune" in full and "only" not in full
    assert sizing.size_warning(fine_tune(lr=2e-4, lora=16, steps=100), 1000) is None
    memorise = sizing.size_warning(fine_tune(steps=100), 15)  # 800 rows drawn from 15: 53 times each
    assert "each of the 15 training rows is drawn about 53 times" in memorise and "train.epochs" in memorise
    assert sizing.size_warning(Config(train=TrainConfig(steps=6)), 15) is None  # a run from scratch: nothing said
    # a hot chat fine-tune is told how to keep the base's general answers; a short one, or one mixing, is not
    chat = lambda cfg, **d: dataclasses.replace(cfg, task="sft", data=dataclasses.replace(cfg.data, **d))  # noqa: E731
    hot = sizing.size_warning(chat(fine_tune(steps=100)), 15)
    assert hot.startswith(memorise) and hot.endswith("; a hot chat fine-tune moves the base's general answers too: "
                                                     "data.mix_source=zoo_general (or general chats of your own, "
                                                     "or replay: the base's own answers) trains them beside yours")
    assert sizing.size_warning(chat(fine_tune(steps=100), mix_source="zoo_general"), 15) == memorise
    assert sizing.size_warning(chat(fine_tune(steps=6)), 15) == short


def test_the_first_step_says_what_compiled_and_the_time_left_at_once(tiny_cfg, tmp_path, capsys):
    cfg = replace(tiny_cfg, train=dict(steps=6, log_every=10, eval_every=0, save_every=6))
    trainer.train(cfg, str(tmp_path), quiet=False)
    out = capsys.readouterr().out.splitlines()
    at = {k: next(i for i, x in enumerate(out) if x.startswith(k))
          for k in ("compiling the train step", "compiled the train step in", "first step:")}
    assert at["compiling the train step"] < at["compiled the train step in"] < at["first step:"]
    assert out[at["compiling the train step"]] == "compiling the train step (batch 16 x 32)"
    m = re.fullmatch(r"compiled the train step in ([\d.]+) s \(([\d.]+) s to trace and lower, ([\d.]+) s in XLA\)",
                     out[at["compiled the train step in"]])
    assert m and abs(float(m[1]) - float(m[2]) - float(m[3])) <= 0.11
    left, = [x for x in out if " s a step: about " in x]
    assert left.endswith("for the 5 steps left") and out.index(left) == at["first step:"] + 1
    assert float(left.split()[0]) < float(m[1])  # the step's own time: its compile apart
    records = [json.loads(x) for x in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in records] == [6]  # train.steps given: log_every as given (a pretraining run's cadence)


def test_a_small_packed_chat_set_sized_in_epochs_trains_its_floor_and_logs_each_step(tmp_path, capsys):
    cfg = sft_cfg(tmp_path, write_jsonl(tmp_path / "chats.jsonl", [{"messages": m} for m in CHATS]))
    cfg = replace(cfg, train=dict(epochs=3, steps=1, log_every=10, eval_every=0, save_every=1000))
    data = sft.SftTask(cfg).make_data(cfg, 0, 1)
    examples, rows = data.packed_examples, data.rows
    assert examples > rows > 0  # several chats a row
    want = min(sizing.MIN_UPDATES, math.ceil(3 * examples / 8))
    assert want > math.ceil(3 * rows / 8)
    capsys.readouterr()
    out = trainer.train(cfg, str(tmp_path / "run"), quiet=False)
    every = max(1, want // 10)
    assert (out["setup"].cfg.train.steps, out["setup"].cfg.train.log_every) == (want, every)
    assert [r["step"] for r in out["records"]] == sorted({s for s in range(1, want + 1) if s % every == 0} | {want})
    said = capsys.readouterr().out
    assert f"train.epochs=3: {want} steps of 8 rows over {rows} training rows ({examples} examples packed" in said
    # No bar off a terminal: each logged step is said as it goes (no evaluation here to say it instead).
    lines = [x for x in said.splitlines() if re.match(r"step \d+ of ", x)]
    assert [int(x.split()[1]) for x in lines] == [r["step"] for r in out["records"]]
    assert lines[0] == f"step {every} of {want}: loss {out['records'][0]['loss']:.4g}, lr {out['records'][0]['lr']:.2e}"
