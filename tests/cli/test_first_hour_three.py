"""A new user's first hour, round three: a fine-tune sized in epochs (steps from the data's rows, said before
training, and the time left from the first step), a given train.steps kept, zoo-sample --system, and
zoo-convert refusing a non-empty output directory before anything loads."""

import math

import pytest

from tests.helpers.shared_runs import finished_gpt_fixture  # noqa: F401 (the fixture finished_gpt)
from zoo.api import decoder
from zoo.cli import convert, sample
from zoo.cli.train import parse, resolve, train_main
from zoo.training import runs


def test_epochs_set_the_steps_from_the_data_and_the_time_left_is_said(finished_gpt, tmp_path, capsys, cache_dir):
    argv = ["--init-from", finished_gpt, "--workdir", str(tmp_path / "ft"), "--set", "train.epochs=0.05",
            "--set", "train.batch_size=8", "--set", "data.seq_len=32", "--set", "train.log_every=2",
            "--set", "train.eval_every=0", "--set", f"data.cache_dir={cache_dir}"]
    assert train_main(argv) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("train.epochs=0.05: "))
    steps, rows = int(line.split()[1]), int(line.split(" over ")[1].split()[0])
    assert steps == math.ceil(0.05 * rows / 8) > 2 and runs.load_config(str(tmp_path / "ft")).train.steps == steps
    assert " s a step: about " in out and f"for the {steps - 1} steps left" in out


def test_fine_tuning_defaults_are_epochs_unless_steps_are_given(finished_gpt, tmp_path):
    base = ["--init-from", finished_gpt, "--workdir", str(tmp_path / "x"), "--print-config"]
    assert resolve(parse(base))[0].train.epochs == 3
    cfg = resolve(parse(base + ["--set", "train.steps=7"]))[0]
    assert (cfg.train.epochs, cfg.train.steps) == (0, 7)


def test_sample_takes_a_system_message_with_chat(finished_gpt, monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(decoder, "generate_ids", lambda lm, prompts, **kw: seen.extend(prompts) or [[65]] * len(prompts))
    assert sample.main([finished_gpt, "--chat", "--system", "Answer in French.", "--prompt", "Hi"]) == 0
    assert capsys.readouterr().out == "A\n"
    from zoo.api.load import load
    text = load(finished_gpt).detokenize(seen[0])
    assert text.index("Answer in French.") < text.index("Hi")
    assert sample.main([finished_gpt, "--system", "x", "--prompt", "Hi"]) == 2
    assert "--system goes with --chat" in capsys.readouterr().err


def test_to_hf_refuses_a_non_empty_directory_before_anything_loads(finished_gpt, tmp_path, monkeypatch, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("mine")
    monkeypatch.setattr(runs, "load_weights", lambda *a, **k: pytest.fail("the run was read"))
    assert convert.main(["to-hf", finished_gpt, str(tmp_path / "out")]) == 2
    assert "is not empty (holds x)" in capsys.readouterr().err
