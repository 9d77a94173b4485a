"""Hugging Face datasets' progress bars stay off the console while zoo reads and tokenizes a source
(zoo.runtime.quiet_datasets), from a Python run in a terminal too, and the user's own setting is back afterwards."""

import sys

import datasets
import pytest

import zoo
from tests.helpers.runs import write_jsonl
from zoo import runtime

BARS = ("Generating train split", "Filter", "tokenizing")  # load_dataset's, load_documents' and the store's


class Terminal:
    """The captured stderr, as a terminal to whoever asks (zoo.train keeps bars in a terminal, not in a log)."""

    def __init__(self, stream):
        self.stream = stream

    def isatty(self):
        return True

    def __getattr__(self, name):
        return getattr(self.stream, name)


@pytest.fixture
def bars_on():
    """datasets' bars shown, as a fresh Python session has them; the session's setting back afterwards."""
    was = datasets.are_progress_bars_disabled()
    datasets.enable_progress_bars()
    yield
    (datasets.disable_progress_bars if was else datasets.enable_progress_bars)()


def test_datasets_draws_its_bars_here(bars_on, tmp_path, capfd, monkeypatch):
    """The control: outside zoo, datasets draws them into the captured stderr (so the test below can fail)."""
    monkeypatch.setattr(sys, "stderr", Terminal(sys.stderr))
    src = write_jsonl(tmp_path / "docs.jsonl", [{"text": f"document {i}"} for i in range(4)])
    datasets.load_dataset("json", data_files=src, split="train", cache_dir=str(tmp_path / "hf"))
    assert "Generating train split" in capfd.readouterr().err


def test_a_python_training_run_from_a_local_jsonl_draws_no_datasets_bar(bars_on, tmp_path, capfd, monkeypatch):
    monkeypatch.setattr(sys, "stderr", Terminal(sys.stderr))
    src = write_jsonl(tmp_path / "docs.jsonl", [{"text": f"document {i}: " + "hello world " * 20} for i in range(40)])
    run = zoo.train("gpt_tiny", workdir=str(tmp_path / "run"), overrides={
        "data.source": src, "data.cache_dir": str(tmp_path / "cache"), "data.seq_len": 16, "train.steps": 1,
        "train.batch_size": 8, "train.eval_every": 0, "train.save_every": 1, "optim.warmup": 0})
    assert run.step == 1
    out = capfd.readouterr()
    for bar in BARS:
        assert bar not in out.err and bar not in out.out
    assert not datasets.are_progress_bars_disabled()  # the user's setting, as it was


def test_quiet_datasets_keeps_bars_off_that_were_off(bars_on):
    datasets.disable_progress_bars()
    with runtime.quiet_datasets():
        assert datasets.are_progress_bars_disabled()
    assert datasets.are_progress_bars_disabled()
    datasets.enable_progress_bars()
    with pytest.raises(RuntimeError):
        with runtime.quiet_datasets():
            raise RuntimeError("a failed read")
    assert not datasets.are_progress_bars_disabled()
