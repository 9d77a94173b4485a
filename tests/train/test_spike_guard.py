"""A finite blow-up is caught (issue "trust, round two", item 1): the adversary's two recipes stop within a
few steps, the checkpoints saved from the blow-up's steps are moved aside, the one named is good, and it
resumes and trains on at a lower learning rate. Ordinary noise does not trip the guard."""

import math
import os

import jax
import numpy as np
import pytest

from conftest import replace
from tests.helpers.runs import run
from zoo.errors import TrainError
from zoo.training import checkpoint
from zoo.training.guard import Guard


def steps(*losses, grads=None, finite=None):
    grads = grads or [1.0] * len(losses)
    return [(i + 1, {"loss_sum": l, "weight": 1.0, "grad_norm": g, "finite": True if finite is None else finite[i]})
            for i, (l, g) in enumerate(zip(losses, grads))]


def test_the_guard_flags_blow_ups_and_not_noise():
    assert Guard(4.0).check(steps(5.9, 5.7, 5.8, 5.2, 5.6, 4.9, 5.0)) is None  # a falling LM loss
    assert Guard(4.0).check(steps(0.05, 0.02, 0.3, 0.01, 1.5, 0.04)) is None  # a near-zero loss meets a hard batch
    step, what, finite, came_in_bad = Guard(4.0).check(steps(5.9, 1.7e5))
    assert (step, finite, came_in_bad) == (2, True, True) and "the loss 1.7e+05 is over 4x (and 4 nats above) the median 5.9" in what
    assert Guard(4.0).check(steps(*[5.9] * 9, grads=[1.0] * 8 + [1500.0]))[:2] == (
        9, "the gradient norm 1500 is over 1000x the median 1 of the 8 steps before (train.spike_guard)")
    assert Guard(4.0).check(steps(*[5.9] * 9, grads=[1.0] * 8 + [900.0])) is None
    # A classifier head that starts at zero: its gradient norm grows 500x in a step, legitimately.
    assert Guard(4.0).check(steps(0.69, 0.69, 0.68, grads=[1e-4, 0.05, 0.06])) is None
    assert Guard(4.0).check(steps(5.9, float("nan"), finite=[True, False]))[2:] == (False, True)  # a NaN loss
    assert Guard(4.0).check(steps(5.9, 5.8, finite=[True, False]))[2:] == (False, False)  # the update overflowed
    assert Guard(0).check(steps(5.9, 1.7e5)) is None  # off


def test_a_checkpoint_is_good_when_the_loss_after_it_is_calm():
    g = Guard(4.0)
    # A slow climb: each step under the blow-up bound, but above the lowest running median by over 0.5 nats.
    assert g.check(steps(5.9, 5.8, 3.8, 5.3, 8.1, 10.4, 14.6, 11.9)) is None
    assert g.confirmed([8, 7, 6, 5, 4, 3, 2, 1]) == 3 and g.confirmed([8, 7, 6, 5, 4]) is None
    policy = checkpoint.KeepLatestAndGood(2, good=3)
    infos = [type("Info", (), {"step": k}) for k in (1, 3, 6, 7, 8)]
    assert policy.should_preserve(infos) == [False, True, False, True, True]


def test_a_step_whose_output_went_uniform_is_not_good():
    """A LoRA run at lr 1000 without clipping: its loss sat at exactly ln(vocab) from step 4 (a uniform output,
    gradients near zero, within 0.5 nats of its start so "calm") until a NaN at step 10; no step from 3 on is good."""
    uniform = math.log(260)
    losses = (5.9, 5.2, 4.9, uniform, uniform, uniform + 1e-5, uniform, uniform, uniform)
    g = Guard(4.0, uniform)
    assert g.check(steps(*losses)) is None
    assert g.confirmed(list(range(1, 10))) == 2  # step 3's params give step 4's uniform loss
    plain = Guard(4.0)  # without the uniform loss every step would do
    plain.check(steps(*losses))
    assert plain.confirmed(list(range(1, 10))) == 8
    fresh = Guard(4.0, uniform)  # a model that starts at the uniform loss (a fresh LM) is not stuck
    fresh.check(steps(uniform, uniform - 0.01, uniform - 0.05))
    assert fresh.confirmed([1, 2]) == 2


def test_a_step_at_the_uniform_loss_with_no_gradient_is_not_good_whatever_came_before():
    """LoRA SFT at lr 1000 without clipping (issue 50): never 0.1 nats under ln 384 before it collapsed, so the
    rule above did not apply, and step 4 was named good. Its loss at ln(vocab) to 1e-4 with a gradient norm ~0 is a
    collapsed model; the same loss with a fresh model's gradient norm is not."""
    uniform = math.log(384)
    g = Guard(4.0, uniform)
    assert g.check(steps(5.940, 5.983, 6.015, 5.9506427, 5.9506414, grads=[2.0, 40.0, 90.0, 0.0, 1e-6])) is None
    assert g.confirmed([1, 2, 3, 4, 5]) == 2
    fresh = Guard(4.0, uniform)
    fresh.check(steps(uniform + 5e-5, uniform - 0.01, grads=[3.9, 3.7]))
    assert fresh.confirmed([1]) == 1


@pytest.mark.parametrize("recipe, keep, blown", [
    (dict(lr=1e6, clip_norm=0, warmup=6), 3, 3),  # warmup from 0: the second update explodes, step 3 shows it
    (dict(lr=30, schedule="constant", warmup=0, clip_norm=0), 3, None),  # a climb over several steps
    # A slow climb: a warmup into lr 10 (5.9 -> 3.8, then 5.3, 8.1, 10.4, 14.6, 11.9, 7.1, 31); saved every
    # step with keep=2, the last good step (3) is older than every step rotation keeps.
    (dict(lr=10, schedule="linear", warmup=150, clip_norm=0), 2, 10),
])
def test_a_blow_up_stops_the_run_and_the_good_checkpoint_resumes(tiny_cfg, tmp_path, recipe, keep, blown):
    work = str(tmp_path / "run")
    cfg = replace(tiny_cfg, optim=recipe, train=dict(steps=20, save_every=1, log_every=1, keep=keep, eval_every=0))
    with pytest.raises(TrainError) as e:
        run(cfg, work, devices=jax.devices()[:1])
    msg = str(e.value)
    assert msg.startswith("training ") and " at step " in msg and "\n" not in msg
    step = int(msg.split(" at step ")[1].split(";")[0])
    assert blown is None or step == blown
    assert step <= 12  # caught within a few steps
    # The checkpoints from step - 1 on were moved aside.
    moved = sorted(int(p.split("-")[0]) for p in os.listdir(os.path.join(work, "checkpoints-blown-up")))
    assert moved and min(moved) == step - 1 and max(checkpoint.all_steps(work) or [0]) < step - 1
    left = checkpoint.all_steps(work)
    if not left:  # blown up in the first update: nothing before it was saved
        assert msg.endswith("no checkpoint from before it is left: start again with a lower learning rate")
        return
    # The step named is the last good one, kept through rotation, and the resume command goes back to it.
    good = checkpoint.last_good(work)
    assert good in left and len(left) <= keep + 1
    if good == left[0]:
        assert f"the newest checkpoint, step {good} in {checkpoint.ckpt_dir(work)}, is good" in msg
    else:
        assert f"the last good checkpoint is step {good} in {checkpoint.ckpt_dir(work)}" in msg
        assert f"--resume {work} --step {good} --set optim.lr=..." in msg and good < step - keep
    out = run(replace(cfg, optim=dict(lr=1e-4), train=dict(steps=good + 4)), work, resume=True,
              resume_step=good, devices=jax.devices()[:1])
    losses = [r["loss"] for r in out["records"]]
    assert int(out["state"].step) == good + 4 and all(math.isfinite(x) and x < 20 for x in losses)
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(out["params"]))
