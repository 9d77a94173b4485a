"""The one training loop: learning, sharding, gradient accumulation, checkpoints, bad input, compiling
once. Device-count invariance and exact resume, for every task: test_invariants.py."""

import json
import os

import jax
import numpy as np
import pytest

from conftest import replace
from tests.helpers.runs import run
from tests.helpers.shared_runs import finished_gpt_fixture  # noqa: F401 (the fixture finished_gpt)
from zoo.errors import CheckpointError, ConfigError, TrainError
from zoo.training import runs, trainer


def test_loss_on_a_repeated_batch_falls_below_ten_percent(tiny_cfg):
    cfg = replace(tiny_cfg, model=dict(dropout=0.0),
                  optim=dict(lr=3e-3, schedule="constant", warmup=10, weight_decay=0.0))
    s = trainer.setup(cfg, jax.devices()[:1])
    state = s.init_state(jax.random.PRNGKey(0))
    batch = trainer.to_device(s.task.make_data(cfg, 0, 1).train(0), s.mesh)
    step = jax.jit(trainer.make_train_step(s.task, s.tx, s.schedule, 1))
    first = None
    for i in range(200):
        state, m = step(state, batch)
        loss = float(m["loss_sum"] / m["weight"])
        first = loss if first is None else first
        if loss < 0.1 * first:
            break
    assert loss < 0.1 * first, (first, loss, i)


def test_params_are_sharded_as_the_mesh_says(tiny_cfg, tmp_path):
    cfg = replace(tiny_cfg, train=dict(steps=1), mesh=dict(data=2, fsdp=2, tensor=2))
    state = run(cfg, tmp_path)["state"]
    fc = state.params["h_0"]["mlp"]["fc"]["kernel"]  # [D, F] = (embed, mlp) -> (fsdp, tensor)
    assert fc.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")
    assert fc.addressable_shards[0].data.shape == (32, 64)


def test_grad_accumulation_matches_one_big_batch(tiny_cfg, tmp_path):
    cfg = replace(tiny_cfg, model=dict(dropout=0.0), train=dict(steps=3))
    two = jax.devices()[:2]  # microbatches of 4 rows over 2 data-parallel devices
    a = run(cfg, tmp_path / "a", devices=two)["state"].params
    b = run(replace(cfg, train=dict(grad_accum=4)), tmp_path / "b", devices=two)["state"].params
    for x, y in zip(jax.tree.leaves(jax.device_get(a)), jax.tree.leaves(jax.device_get(b))):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def test_checkpoints_hold_the_config_and_rotate(tiny_cfg, tmp_path):
    run(replace(tiny_cfg, train=dict(steps=6, save_every=1, keep=2)), tmp_path)
    steps = sorted(int(d) for d in os.listdir(tmp_path / "checkpoints") if d.isdigit())
    assert steps == [5, 6]
    assert runs.load_config(str(tmp_path)).train.keep == 2
    assert json.load(open(tmp_path / "config.json"))["model"]["family"] == "gpt"


def test_batch_not_divisible_by_data_parallel_size(tiny_cfg, tmp_path):
    with pytest.raises(ConfigError, match=r"train.batch_size=12 .* data-parallel size mesh.data\*mesh.fsdp=8"):
        run(replace(tiny_cfg, train=dict(batch_size=12)), tmp_path)


def test_fresh_run_refuses_a_workdir_with_checkpoints(tiny_cfg, tmp_path):
    run(replace(tiny_cfg, train=dict(steps=1)), tmp_path)
    with pytest.raises(TrainError, match="already holds checkpoints; continue it with"):
        run(replace(tiny_cfg, train=dict(steps=1)), tmp_path)


def test_a_workdir_linked_to_another_run_is_refused_before_its_lock_is_written(finished_gpt, tmp_path):
    """A fresh run whose workdir is a link to a finished run is refused, and that run's .lock keeps its holder's
    pid (and its time): nothing is written before the refusal."""
    link, lock = tmp_path / "link", os.path.join(finished_gpt, ".lock")
    os.symlink(finished_gpt, link)
    before = open(lock).read(), os.stat(lock).st_mtime_ns
    with pytest.raises(TrainError, match="already holds checkpoints; continue it with"):
        run(runs.load_config(finished_gpt), link)
    assert (open(lock).read(), os.stat(lock).st_mtime_ns) == before


def test_resume_without_checkpoint(tiny_cfg, tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint in"):
        run(tiny_cfg, tmp_path / "empty", resume=True)


def test_train_and_eval_steps_compile_once(tiny_cfg, tmp_path, caplog):
    cfg = replace(tiny_cfg, train=dict(steps=6, eval_every=2, eval_batches=2, log_every=1, save_every=2))
    with caplog.at_level("WARNING"), jax.log_compiles(True):
        run(cfg, tmp_path)
    compiles = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Compiling jit(")]
    assert sum("jit(train_step)" in m for m in compiles) == 1, compiles
    assert sum("jit(eval_step)" in m for m in compiles) == 1, compiles
