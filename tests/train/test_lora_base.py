"""A LoRA run whose base is gone, damaged or another model: every reader (zoo-sample's load_run, --resume) says
so once, naming the base and base.json, and blames no adapter step (no "does not restore" per step)."""

import dataclasses
import os
import shutil

import jax
import pytest

from conftest import replace
from tests.helpers import shared, tiny_configs
from tests.helpers.runs import run
from zoo.cli.train import train_main
from zoo.errors import CheckpointError
from zoo.training import checkpoint, runs


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory, cache_dir):
    """A directory with base/ (a 2-step tiny Llama), other/ (a wider one) and lora/ (4 LoRA steps on base/)."""
    def build(root):
        cfg = replace(tiny_configs.llama_lm(cache_dir), train=dict(steps=2, save_every=2))
        run(cfg, root / "base", devices=jax.devices()[:1])
        run(replace(cfg, model=dict(d_model=48)), root / "other", devices=jax.devices()[:1])
        lora = replace(cfg, model=dict(lora_rank=2, lora_alpha=4.0), train=dict(steps=4, save_every=2))
        run(dataclasses.replace(lora, init_from=str(root / "base")), root / "lora", devices=jax.devices()[:1])
    return str(shared.once(tmp_path_factory, "lora-base-damage", build))


def _truncate_base(root):
    step = checkpoint.step_dir(os.path.join(root, "base"), 2)
    f = max((os.path.join(d, n) for d, _, ns in os.walk(os.path.join(step, "params")) for n in ns if "/d" in d),
            key=os.path.getsize)
    with open(f, "r+b") as fh:
        fh.truncate(100)


def _corrupt_base_json(root):
    with open(os.path.join(root, "lora", runs.BASE_FILE), "w") as f:
        f.write('{"init_from": ')


CASES = {  # what is done -> what the one line says
    "base deleted": (lambda r: shutil.rmtree(os.path.join(r, "base")), "is missing"),
    "base replaced by another model": (lambda r: (shutil.rmtree(os.path.join(r, "base")), shutil.copytree(
        os.path.join(r, "other"), os.path.join(r, "base"))), "has changed since (its checksums differ from those in"),
    "base.json corrupt": (_corrupt_base_json, "base.json is damaged (JSONDecodeError"),
    "base's checkpoint truncated": (_truncate_base, "does not restore: an array file is missing or truncated"),
}


def copied(runs_dir, tmp_path) -> str:
    """A copy of the runs, the LoRA run's configs and base.json pointed at the copy's base."""
    root = str(tmp_path / "runs")
    shutil.copytree(runs_dir, root)
    old, new = os.path.join(runs_dir, "base"), os.path.join(root, "base")
    for d, _, names in os.walk(os.path.join(root, "lora")):
        for n in names:
            if n in ("config.json", "base.json", "metadata") and "digest" not in d:
                p = os.path.join(d, n)
                with open(p) as f:
                    text = f.read()
                with open(p, "w") as f:
                    f.write(text.replace(old, new))
    return root


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_missing_or_changed_base_is_said_once_and_no_adapter_step_is_blamed(runs_dir, tmp_path, capsys, case):
    root = copied(runs_dir, tmp_path)
    lora = os.path.join(root, "lora")
    assert runs.load_run(lora)[3].model.lora_rank == 2  # the copy reads before the damage
    damage, says = CASES[case]
    damage(root)
    capsys.readouterr()
    with pytest.raises(CheckpointError, match="base") as e:
        runs.load_run(lora)
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert "does not restore: " not in capsys.readouterr().err  # no adapter step blamed
    assert train_main(["--resume", lora, "--set", "train.steps=6", "--quiet"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: ") and "base" in err[0], err
    assert checkpoint.all_steps(lora) == [4, 2] and not os.path.exists(os.path.join(lora, "checkpoints-damaged"))
