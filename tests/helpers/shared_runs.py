"""Runs that several CLI tests read and none of them changes, trained once a test session by whichever
pytest-xdist worker asks first (tests/helpers/shared.py). A test module uses one by importing its fixture function
(`from tests.helpers.shared_runs import finished_gpt_fixture`), then names the run as an argument (`finished_gpt`)."""

import dataclasses

import jax
import pytest

from tests.helpers import shared, tiny_configs
from tests.helpers.runs import run


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
