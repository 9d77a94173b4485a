"""The damage table for every reader: each of the twelve kinds of damage in tests/train/test_faults.py's DAMAGE,
done to step 4 of a run checkpointed at steps 2 and 4, read by each reader of a run's checkpoints: `--resume`
(zoo-train's command line up to its first step), zoo-sample (`load_run`), zoo-convert to-hf and init_from
(`start_from`).

What it proves, for every (reader, damage): a reader that needs a damaged item says so in exactly one line
("warning: checkpoint .../4 does not restore: <reason>; trying step 2") and reads step 2; a reader that does
not need it (the weights readers, when only the optimizer state is damaged) reads step 4 without a word; the
weights it takes equal that step's bit for bit; and its config is that same step's. The run's two steps were
saved under different configs (data.seq_len 32, then 24 after a resume), so a reader that took one step's
params under the other step's config shows. Nothing is deleted: `--resume` moves the damaged step into
checkpoints-damaged/ unchanged, the other readers leave every file as it was. A deleted digest/ is damage,
not a run from before checksums ("read unverified"); a damaged config/ never lets step 4's state be read
under step 2's config.
"""

import json
import os
import re

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from conftest import replace
from tests.helpers import tiny_configs
from tests.helpers.runs import run
from tests.train.test_faults import DAMAGE, copy_of
from zoo.cli.train import train_main
from zoo.hf import convert
from zoo.training import checkpoint, runs, start, trainer
from zoo.training.checksums import fingerprint

# The item of a step each kind of damage hits (a checksum that disagrees is the params' entry in digest/).
HITS = {"truncated params data": "params", "random bytes in params": "params", "params item deleted": "params",
        "array store deleted": "params", "truncated _METADATA": "params", "random bytes in optimizer state": "train",
        "train item deleted": "train", "config item deleted": "config", "a checksum that disagrees": "digest",
        "digest deleted": "digest",
        "digest and the run's marker deleted": "digest", "a config that does not describe its arrays": "config"}
WEIGHTS = {"params", "config", "digest"}  # what zoo-sample, to-hf and init_from read; --resume reads `train` too
SEQ_LEN = {2: 32, 4: 24}  # data.seq_len each step was saved under


@pytest.fixture(scope="module")
def base(tmp_path_factory, cache_dir):
    """(cfg, workdir, step -> what that step holds) of a 4-step tiny GPT run checkpointed at steps 2 and 4, the
    last two steps resumed with data.seq_len=24: each step's config is told apart by its seq_len."""
    cfg = replace(tiny_configs.gpt_lm(cache_dir), train=dict(steps=4, save_every=2, keep=5, log_every=2))
    work = str(tmp_path_factory.mktemp("damage_readers") / "base")
    run(cfg, work, stop_at_step=2)
    run(replace(cfg, data=dict(seq_len=SEQ_LEN[4])), work, resume=True)
    held = {}
    for s in (2, 4):
        params = jax.device_get(runs.load_params(work, step=s))
        with open(os.path.join(checkpoint.step_dir(work, s), "digest", "metadata")) as f:
            train_digest = json.load(f)["train"]
        held[s] = dict(params=params, fingerprint=fingerprint(params)[0], train=train_digest)
        assert runs.load_config(work, s).data.seq_len == SEQ_LEN[s]
    assert held[2]["fingerprint"] != held[4]["fingerprint"]  # the steps' weights are told apart too
    return cfg, work, held


def damaged(base, tmp_path, damage) -> tuple[str, dict]:
    """(a copy of the base run with `damage` done to its step 4, its files -> sizes after the damage)."""
    work = copy_of(base, tmp_path)
    DAMAGE[damage][0](checkpoint.step_dir(work, 4))
    return work, files(work)


def files(root: str) -> dict:
    return {os.path.relpath(os.path.join(d, f), root): os.path.getsize(os.path.join(d, f))
            for d, _, names in os.walk(root) for f in names}


def under(tree: dict, folder: str) -> dict:
    """The part of `files`' answer inside `folder`, relative to it."""
    return {os.path.relpath(p, folder): n for p, n in tree.items() if p.startswith(folder + os.sep)}


def step_read(damage: str, reads: set) -> int:
    return 2 if HITS[damage] in reads else 4


def check_said(err: str, work: str, damage: str, step: int) -> None:
    """One warning line naming step 4 and its damage when step 2 was read; nothing at all when step 4 was."""
    lines = err.strip().splitlines()
    if step == 4:
        assert lines == []
        return
    assert len(lines) == 1, lines  # no second warning, no traceback, no "read unverified" note
    assert lines[0].startswith(f"warning: checkpoint {checkpoint.step_dir(work, 4)} does not restore: "), lines[0]
    assert re.search(DAMAGE[damage][1], lines[0]), lines[0]
    assert lines[0].endswith("; trying step 2"), lines[0]


def test_every_kind_of_damage_is_placed_by_the_item_it_hits():
    assert set(HITS) == set(DAMAGE)
    assert {HITS[d] for d in DAMAGE} - WEIGHTS == {"train"}  # the one item weights readers may do without


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_resume_says_it_once_goes_on_from_step_2_and_moves_step_4_aside_unchanged(base, tmp_path, capsys,
                                                                                   monkeypatch, damage):
    work, before = damaged(base, tmp_path, damage)
    reached = {}

    def first_step(cfg, workdir, s, state, data, mngr, *rest):  # the run as it would start training
        checkpoint.finish(mngr)
        reached.update(cfg=cfg, state=state)
        return {"records": [], "state": state, "interrupted": True, "setup": s}
    monkeypatch.setattr(trainer, "_loop", first_step)
    assert train_main(["--resume", work, "--quiet"]) == 0
    check_said(capsys.readouterr().err, work, damage, 2)  # --resume needs every item
    state = reached["state"]
    assert int(state.step) == 2
    assert fingerprint(state.params)[0] == base[2][2]["fingerprint"]
    assert fingerprint({"step": state.step, "opt_state": state.opt_state, "rng": state.rng})[0] == base[2][2]["train"]
    # Kept, not deleted: step 4 as the damage left it, in checkpoints-damaged/; step 2 untouched.
    assert checkpoint.all_steps(work) == [2]
    [aside] = os.listdir(os.path.join(work, "checkpoints-damaged"))
    assert aside.startswith("4-")
    assert files(os.path.join(work, "checkpoints-damaged", aside)) == under(before, os.path.join("checkpoints", "4"))
    assert under(files(work), os.path.join("checkpoints", "2")) == under(before, os.path.join("checkpoints", "2"))
    assert reached["cfg"].data.seq_len == SEQ_LEN[2]


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_sampling_reads_the_config_and_weights_of_one_step_and_changes_nothing(base, tmp_path, capsys, damage):
    work, before = damaged(base, tmp_path, damage)
    _, params, _, cfg = runs.load_run(work)  # what zoo-sample reads
    step = step_read(damage, WEIGHTS)
    check_said(capsys.readouterr().err, work, damage, step)
    assert fingerprint(params)[0] == base[2][step]["fingerprint"]
    assert cfg.data.seq_len == SEQ_LEN[step]
    assert files(work) == before


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_to_hf_exports_the_weights_and_config_of_the_step_it_names(base, tmp_path, capsys, damage):
    work, before = damaged(base, tmp_path, damage)
    out = str(tmp_path / "hf")
    convert.to_hf(work, out)
    step = step_read(damage, WEIGHTS)
    said = capsys.readouterr()
    check_said(said.err, work, damage, step)
    assert f"params of {work}, step {step});" in said.out
    cfg = base[0]
    want = convert.export_converter(cfg.model).params_to_hf(base[2][step]["params"], cfg.model)
    got = load_file(os.path.join(out, "model.safetensors"))
    assert sorted(got) == sorted(want)
    assert all(got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]) for k in want)
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)[convert.SEQ_LEN_KEY] == SEQ_LEN[step]
    assert files(work) == before


@pytest.fixture(scope="module")
def fine_tune(base):
    """(setup, fresh state) of a run of the base's model that starts from another run's weights."""
    s = trainer.setup(base[0])
    return s, s.init_state(jax.random.PRNGKey(1))


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_init_from_copies_the_weights_of_one_whole_step_read_under_its_own_config(base, fine_tune, tmp_path, capsys,
                                                                                  monkeypatch, damage):
    work, before = damaged(base, tmp_path, damage)
    read = {"config": [], "params": []}  # the steps whose config / params restored, in order

    def spy(item, f):
        def wrapped(workdir, step, *a):
            out = f(workdir, step, *a)
            read[item].append(step)
            return out
        return wrapped
    monkeypatch.setattr(checkpoint, "restore_config", spy("config", checkpoint.restore_config))
    monkeypatch.setattr(runs, "_restore_params", spy("params", runs._restore_params))
    state, got = start.start_from(*fine_tune, work)
    step = step_read(damage, WEIGHTS)
    check_said(capsys.readouterr().err, work, damage, step)
    assert got == step
    assert fingerprint(state.params)[0] == base[2][step]["fingerprint"]
    assert read["params"] == [step] and read["config"][-1] == step  # the params read under their own step's config
    assert files(work) == before
