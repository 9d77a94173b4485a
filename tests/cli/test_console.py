"""What train.py prints: a line per evaluation, a task-appropriate summary, nothing but the summary with --quiet."""

import pytest

from zoo.cli.train import train_main

# gpt_tiny cut to one layer of width 64 on 32-token rows: what is checked is what gets printed, not what is learned.
TINY = ["--set", "train.steps=4", "--set", "train.eval_every=2", "--set", "train.eval_batches=1", "--set",
        "train.batch_size=8", "--set", "train.log_every=2", "--set", "train.sample_tokens=0",
        "--set", "model.num_layers=1", "--set", "model.d_model=64", "--set", "model.num_heads=2",
        "--set", "model.d_ff=128", "--set", "data.seq_len=32"]


@pytest.mark.parametrize("quiet", [False, True])
def test_a_line_per_evaluation_unless_quiet(tmp_path, cache_dir, capsys, quiet):
    argv = ["gpt_tiny", "--workdir", str(tmp_path / "run"), "--set", f"data.cache_dir={cache_dir}", *TINY]
    assert train_main(argv + (["--quiet"] if quiet else [])) == 0
    out = capsys.readouterr().out.splitlines()
    evals = [line for line in out if line.startswith("step ")]
    assert evals == [] if quiet else [line.split(":")[0] for line in evals] == ["step 2", "step 4"]
    assert "eval_loss" in out[-1] and out[-1].startswith("done: step 4 (")
