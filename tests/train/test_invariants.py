"""The trainer's invariants, written once and run for every task (gpt_lm, bert_mlm, bert_cls, seq2seq, dpo, grpo;
gpt_lm also on the Llama-style decoder) on its tiny config: 1 device and 8 devices in each mesh layout train the
same numbers over 6 steps, and a run on 8 devices (data 2, fsdp 2, tensor 2) stopped at step 3, resumed and
finished is the uninterrupted 6-step run, bit for bit (dropout is on, so the per-step rng must be replayed too)."""

import jax
import numpy as np
import pytest

from conftest import replace
from tests.helpers import tiny_configs
from tests.helpers.runs import losses, run
from zoo.training import checkpoint

# Every case trains two or three tiny runs end to end (up to a minute on two loaded cores): marked slow.
pytestmark = pytest.mark.slow

# The (data, fsdp, tensor) layouts of the 8 devices each task is compared with 1 device on: every task
# takes the layout that uses every axis (its first, where its resume is checked too); gpt_lm, the cheapest,
# also parameters sharded 4 ways (fsdp).
MESHES = {
    "gpt_lm": [(2, 2, 2), (2, 4, 1)],
    "llama_lm": [(2, 2, 2)],  # its 2 key/value heads split over tensor=2
    "bert_mlm": [(2, 2, 2)],
    "bert_cls": [(2, 2, 2)],
    "seq2seq": [(2, 2, 2)],
    "dpo": [(2, 2, 2)],  # its reference log-probabilities precomputed before the first step, read back on resume
    "grpo": [(2, 2, 2)],  # its completions sampled on the mesh from the step's params, with keys of (seed, step)
}
assert set(MESHES) == set(tiny_configs.TINY)


def train_losses(out):
    return [r["loss"] for r in out["records"]]


def leaf_pairs(a, b, paths: bool = False):
    """The leaves of two pytrees of the same structure, side by side, on the host (and their paths)."""
    a, b = jax.device_get(a), jax.device_get(b)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    if paths:
        flat = jax.tree_util.tree_flatten_with_path(a)[0]
        return [(jax.tree_util.keystr(p), x, y) for (p, x), y in zip(flat, jax.tree.leaves(b))]
    return zip(jax.tree.leaves(a), jax.tree.leaves(b))


def on_mesh(cfg, mesh):
    d, f, t = mesh
    return replace(cfg, mesh=dict(data=d, fsdp=f, tensor=t))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, cache_dir):
    """(task, mesh) -> (workdir, output, config) of the task's tiny config (6 steps, a checkpoint every 3) trained
    without a stop, on 8 devices in that layout or ((1, 1, 1)) on one device: each trained once for the module
    (the 1-device run and the resume layout's run serve both tests)."""
    done = {}

    def get(task, mesh):
        if (task, mesh) not in done:
            work = tmp_path_factory.mktemp(f"{task}-{'x'.join(map(str, mesh))}")
            kw = {"devices": jax.devices()[:1]} if mesh == (1, 1, 1) else {}
            cfg = on_mesh(tiny_configs.TINY[task](cache_dir), mesh)
            done[task, mesh] = work, run(cfg, work, **kw), cfg
        return done[task, mesh]
    return get


@pytest.mark.parametrize("task, mesh", [(task, mesh) for task, meshes in MESHES.items() for mesh in meshes],
                         ids=lambda x: "x".join(map(str, x)) if isinstance(x, tuple) else x)
def test_eight_devices_match_one(uninterrupted, task, mesh):
    one_dir, one, _ = uninterrupted(task, (1, 1, 1))
    many_dir, many, _ = uninterrupted(task, mesh)
    assert many["setup"].mesh.devices.size == 8
    # abs: grpo's loss is ~0 by construction (its advantages sum to zero within a group), the rest ~1 or more.
    assert losses(many_dir) == pytest.approx(losses(one_dir), rel=1e-5, abs=1e-6)
    assert train_losses(many) == pytest.approx(train_losses(one), rel=1e-5, abs=1e-6)
    if task == "grpo":  # the same completions sampled on 8 devices as on 1: the same rewards
        assert [r["reward"] for r in many["records"]] == [r["reward"] for r in one["records"]]
        assert len({r["reward"] for r in one["records"]}) > 1
    for path, a, b in leaf_pairs(many["state"].params, one["state"].params, paths=True):
        if path.endswith("['key']['bias']"):
            # Key biases get an exactly-zero gradient (softmax ignores a per-query constant), so their values are
            # Adam-normalised rounding noise that no layout can reproduce (~1e-7 for gpt_lm; ~1e-6 for dpo, whose
            # gradients are small): not compared, only bounded.
            assert np.abs(a).max() < 1e-4 and np.abs(b).max() < 1e-4, path
            continue
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=path)


@pytest.mark.parametrize("task", list(MESHES))
def test_resume_reproduces_the_uninterrupted_run_bit_for_bit(uninterrupted, tmp_path, task):
    """On the task's 8-device layout that uses every axis: parameters and optimizer state sharded."""
    full_dir, full, cfg = uninterrupted(task, MESHES[task][0])
    part = run(cfg, tmp_path / "part", stop_at_step=3)
    assert int(part["state"].step) == 3 and checkpoint.latest_step(str(tmp_path / "part")) == 3
    resumed = run(cfg, tmp_path / "part", resume=True)
    assert int(resumed["state"].step) == 6
    for a, b in leaf_pairs(full["state"], resumed["state"]):
        np.testing.assert_array_equal(a, b)
    assert losses(tmp_path / "part") == losses(full_dir)  # same data, same order, same numbers
    assert train_losses(resumed) == train_losses(full)[3:]
