"""A full disk (ENOSPC) at each write a run makes ends it in one line, rc 2, with its half-written .tmp files
removed, the checkpoints it had kept, and the next command named (--resume when a checkpoint exists): the
checkpoint marker (last_good), the data state, metrics.jsonl, TensorBoard (in tensorboardX's writer thread, and
at exit), config.json, the tokenizer copied into the run, and a LoRA run's base.json. Orbax's own failed save is
tests/train/test_faults.py's."""

import builtins
import dataclasses
import errno
import glob
import os
import re

import pytest

from conftest import replace
from tests.helpers import tiny_configs
from tests.helpers.processes import config_file
from zoo.cli.train import train_main
from zoo.training import checkpoint

REAL_OPEN = builtins.open


def full_at(pattern: str):
    """builtins.open that fails with ENOSPC when a file whose path matches `pattern` is opened for writing."""
    def fake_open(file, mode="r", *a, **kw):
        if any(c in mode for c in "wax") and re.search(pattern, os.fspath(file) if not isinstance(file, int) else ""):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(file))
        return REAL_OPEN(file, mode, *a, **kw)
    return fake_open


def tb_thread_fails(monkeypatch):
    """TensorBoard's events fail in tensorboardX's writer thread, as a write to a full disk does there."""
    from tensorboardX import record_writer

    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "events.out.tfevents")
    monkeypatch.setattr(record_writer.RecordWriter, "write", write)


@pytest.fixture(scope="module")
def lora_base(tmp_path_factory, cache_dir):
    """A 2-step tiny Llama run whose tokenizer is a directory (copied into a run that starts from it)."""
    from tests.helpers.runs import run
    cfg = replace(tiny_configs.llama_lm(cache_dir), train=dict(steps=2, save_every=2))
    work = str(tmp_path_factory.mktemp("full_disk") / "base")
    run(cfg, work)
    return cfg, work


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A tiny random Llama as a Hugging Face directory: a run that starts from it converts it into WORKDIR/base."""
    from tests.helpers import tiny_lms
    path = str(tmp_path_factory.mktemp("full_disk_hf") / "llama")
    tiny_lms.llama(path)
    return path


def gpt(cache_dir, lora_base):
    return replace(tiny_configs.gpt_lm(cache_dir), train=dict(steps=6, save_every=2, log_every=1, eval_every=0))


def streamed(cache_dir, lora_base):
    return replace(gpt(cache_dir, lora_base), data=dict(streaming=True))


def lora(cache_dir, lora_base):
    cfg, work = lora_base
    cfg = replace(cfg, model=dict(lora_rank=2, lora_alpha=4.0), train=dict(steps=6, save_every=2, log_every=1,
                                                                             eval_every=0))
    return dataclasses.replace(cfg, init_from=work)


# (case, config, the path that fails or "tb-thread", whether a checkpoint was kept before it)
CASES = [
    ("the checkpoint marker last_good", gpt, r"checkpoints/last_good\.tmp$", True),
    ("the data state of a streamed step", streamed, r"data_state/4\.p0\.json\.tmp$", True),
    ("metrics.jsonl at the start", gpt, r"metrics\.jsonl$", False),
    ("config.json", gpt, r"/config\.json$", False),
    ("TensorBoard's writer thread", gpt, "tb-thread", False),
    ("a converted Hugging Face base", "hf", r"/base/config\.json$", False),
    ("a LoRA run's base.json", lora, r"/base\.json$", False),
    ("a LoRA run's last_good", lora, r"checkpoints/last_good\.tmp$", True),
]


@pytest.mark.parametrize("what, make, pattern, kept", CASES, ids=[c[0] for c in CASES])
def test_a_full_disk_at_each_write_is_one_line_and_loses_nothing(what, make, pattern, kept, cache_dir, lora_base,
                                                                  tmp_path, capsys, monkeypatch, request):
    if make == "hf":  # a LoRA run of the Hugging Face directory
        hf = request.getfixturevalue("hf_dir")
        cfg = dataclasses.replace(lora(cache_dir, lora_base), init_from=hf)
    else:
        cfg = make(cache_dir, lora_base)
    capsys.readouterr()  # what building the fixtures printed
    path = config_file(cfg, tmp_path)
    work = str(tmp_path / "run")
    if pattern == "tb-thread":
        tb_thread_fails(monkeypatch)
    else:
        monkeypatch.setattr(builtins, "open", full_at(pattern))
    rc = train_main([path, "--workdir", work, "--quiet"])
    monkeypatch.undo()
    # a 6-step fine-tune is also warned that it is short (zoo.training.sizing): only the error line is counted
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and not line.startswith("warning: ")]
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("error: writing ") and "No space left on device" in err[0], err
    steps = checkpoint.all_steps(work) if os.path.isdir(work) else []
    assert bool(steps) == kept, steps
    assert (f"--resume {work}" in err[0]) == kept and ("run the same command again" in err[0]) != kept, err
    assert not glob.glob(os.path.join(work, "**", "*.tmp"), recursive=True)
    if kept:  # the kept checkpoint resumes to the end
        assert train_main(["--resume", work, "--quiet"]) == 0
        assert checkpoint.all_steps(work)[0] == 6
