"""What the tokens-to-loss bench reads off a validation curve (zoo.bench.loss_curves): the first crossing of the
target, interpolated between evaluations; a target never reached reported as such; spreads over seeds; the table."""

import pytest

from zoo.bench import loss_curves


def curve(losses, every=1000, per_step_s=2.0):
    return [{"tokens": (i + 1) * every, "eval_loss": l, "seconds": (i + 1) * every / 1000 * per_step_s}
            for i, l in enumerate(losses)]


def test_crossing_interpolates_between_the_evaluations_around_the_target():
    c = curve([3.0, 2.5, 2.0, 1.8])  # 2.2 lies 0.6 of the way from 2.5 (2000 tokens) to 2.0 (3000 tokens)
    assert loss_curves.crossing(c, 2.2) == pytest.approx({"tokens": 2600.0, "seconds": 5.2})
    assert loss_curves.crossing(c, 2.0) == pytest.approx({"tokens": 3000.0, "seconds": 6.0})  # exactly at a point


def test_crossing_is_the_first_one_not_a_later_one():
    c = curve([3.0, 2.0, 2.6, 1.5])  # reaches 2.2 between points 1 and 2, then bounces back above it
    assert loss_curves.crossing(c, 2.2)["tokens"] == pytest.approx(1000 + 1000 * 0.8 / 1.0)


def test_a_curve_already_below_the_target_crosses_at_its_first_point_and_one_above_never():
    assert loss_curves.crossing(curve([1.0, 0.9]), 2.0) == {"tokens": 1000.0, "seconds": 2.0}
    assert loss_curves.crossing(curve([3.0, 2.5, 2.3]), 2.2) is None


def test_summary_counts_the_seeds_that_reach_the_target_and_spreads_over_them():
    rows = {"fast": [curve([2.5, 2.0, 1.5]), curve([2.0, 1.6, 1.4])],  # reaches 2.0 at 2000 and 1000 tokens
            "slow": [curve([3.0, 2.8, 2.5]), curve([3.0, 2.9, 2.7])]}
    s = loss_curves.summarise(rows, target=2.0, budget_tokens=3000)
    assert (s["fast"]["reached"], s["fast"]["seeds"]) == (2, 2)
    assert s["fast"]["tokens_to_target"] == pytest.approx({"mean": 1500.0, "min": 1000.0, "max": 2000.0,
                                                           "std": 707.1068}, rel=1e-6)
    assert s["fast"]["tokens_to_target_vs_budget"] == pytest.approx(0.5)
    assert s["fast"]["final_loss"]["mean"] == pytest.approx(1.45)
    assert s["slow"]["reached"] == 0 and "tokens_to_target" not in s["slow"]
    lines = loss_curves.table(s, 2.0, 3000).splitlines()
    assert lines[0] == "target: validation loss 2.0000; budget 3,000 tokens"
    assert lines[-2].startswith("fast | 2/2 | 1,500 ± 707 | 0.50 | 3 ± 1 | 1.4500 ± 0.0707")
    assert lines[-1] == "slow | 0/2 | not reached | - | - | 2.6000 ± 0.1414"
