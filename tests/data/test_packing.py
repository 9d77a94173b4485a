"""Packing: first fit decreasing places every example once within capacity, into the first row with room;
rows carry segment ids and positions restarting per example; batches are a pure function of (seed, step)."""

import numpy as np
import pytest

from zoo.data import packing


def reference_ffd(lengths, capacity):
    """First fit decreasing by a plain scan over the rows (the segment tree must agree)."""
    rows, free = [], []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        for r, f in enumerate(free):
            if f >= lengths[i]:
                rows[r].append(i)
                free[r] -= lengths[i]
                break
        else:
            rows.append([i])
            free.append(capacity - lengths[i])
    return rows


@pytest.mark.parametrize("seed", range(5))
def test_first_fit_decreasing_equals_the_plain_scan_and_keeps_every_example_once(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 33, size=int(rng.integers(1, 200))).tolist()
    rows = packing.first_fit_decreasing(lengths, 32)
    assert rows == reference_ffd(lengths, 32)
    assert sorted(i for r in rows for i in r) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in r) <= 32 for r in rows)
    # Fewer rows than one example per row whenever two short examples exist.
    if sum(x <= 16 for x in lengths) >= 2:
        assert len(rows) < len(lengths)


def test_lengths_outside_the_row_are_refused():
    with pytest.raises(ValueError, match=r"in \[1, 8\]"):
        packing.first_fit_decreasing([3, 9], 8)


def test_rows_carry_segments_positions_and_zero_weight_padding():
    ex = packing.Examples([np.arange(3), np.arange(10, 15), np.arange(20, 22)],
                          [np.arange(1, 4), np.arange(11, 16), np.arange(21, 23)],
                          [np.ones(3), np.array([0, 0, 1, 1, 1.0]), np.zeros(2)])
    plan = packing.first_fit_decreasing(ex.lengths, 8)
    assert plan == [[1, 0], [2]]
    b = ex.rows(plan, np.array([0, 1, -1]), 8)
    np.testing.assert_array_equal(b["inputs"][0], [10, 11, 12, 13, 14, 0, 1, 2])
    np.testing.assert_array_equal(b["targets"][0], [11, 12, 13, 14, 15, 1, 2, 3])
    np.testing.assert_array_equal(b["segment_ids"][0], [1, 1, 1, 1, 1, 2, 2, 2])
    np.testing.assert_array_equal(b["positions"][0], [0, 1, 2, 3, 4, 0, 1, 2])
    np.testing.assert_array_equal(b["weights"][0], [0, 0, 1, 1, 1, 1, 1, 1])
    np.testing.assert_array_equal(b["segment_ids"][1], [1, 1, 0, 0, 0, 0, 0, 0])
    assert not b["weights"][1:].any() and not b["segment_ids"][2].any()  # padding and the empty row weigh 0
    assert packing.real_fraction(ex, plan, 8) == 10 / 16


def test_batches_are_a_pure_function_of_seed_and_step_and_split_over_processes():
    ex = packing.Examples([np.arange(n) for n in range(1, 9)], [np.arange(n) for n in range(1, 9)],
                          [np.ones(n) for n in range(1, 9)])
    plan = packing.first_fit_decreasing(ex.lengths, 8)
    a = packing.PackedBatches(ex, plan, 8, 4, seed=3)
    b = packing.PackedBatches(ex, plan, 8, 4, seed=3)
    for step in (0, 5, 17):
        for k in packing.FIELDS:
            np.testing.assert_array_equal(a(step)[k], b(step)[k])
    halves = [packing.PackedBatches(ex, plan, 8, 4, seed=3, process_index=p, process_count=2)(5) for p in (0, 1)]
    np.testing.assert_array_equal(np.concatenate([h["inputs"] for h in halves]), a(5)["inputs"])
    assert not np.array_equal(a(0)["inputs"], packing.PackedBatches(ex, plan, 8, 4, seed=4)(0)["inputs"])
