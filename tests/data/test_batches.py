"""zoo.data.batches: training windows as a pure function of (seed, step), split over processes, and
consecutive evaluation windows that wrap."""

import numpy as np
import pytest

from tests.helpers.tiny_configs import data_cfg
from zoo.data import store as zstore
from zoo.data.batches import Batches, eval_batches
from zoo.errors import ZooDataError

TOKENS = np.arange(1000, dtype=np.uint16)  # a row's content then tells where its window starts


def test_batches_are_windows_and_a_pure_function_of_seed_and_step():
    b = Batches(TOKENS, seq_len=16, global_batch=8, seed=3)
    x = b(5)
    assert x["inputs"].dtype == x["targets"].dtype == np.int32 and x["inputs"].shape == (8, 16)
    assert np.array_equal(x["weights"], np.ones((8, 16), np.float32))
    starts = x["inputs"][:, :1]
    assert np.array_equal(x["inputs"], starts + np.arange(16))  # contiguous windows of the stream
    assert np.array_equal(x["targets"], x["inputs"] + 1)  # targets are inputs shifted by one
    assert starts.max() <= 1000 - 17
    same = Batches(TOKENS, seq_len=16, global_batch=8, seed=3)(5)
    assert all(np.array_equal(x[k], same[k]) for k in x)
    assert not np.array_equal(x["inputs"], b(6)["inputs"])
    assert not np.array_equal(x["inputs"], Batches(TOKENS, 16, 8, seed=4)(5)["inputs"])


def test_batches_reach_the_last_window():
    starts = np.concatenate([Batches(TOKENS[:20], 16, 8, seed=0)(s)["inputs"][:, 0] for s in range(20)])
    assert set(starts) == {0, 1, 2, 3}


def test_process_slices_concatenate_to_the_global_batch():
    whole = Batches(TOKENS, 16, 8, seed=1)(7)
    parts = [Batches(TOKENS, 16, 8, seed=1, process_index=p, process_count=2)(7) for p in range(2)]
    for k in whole:
        assert parts[0][k].shape[0] == 4
        assert np.array_equal(np.concatenate([p[k] for p in parts]), whole[k])
    whole = eval_batches(TOKENS, 16, 8, 2)
    parts = [eval_batches(TOKENS, 16, 8, 2, process_index=p, process_count=2) for p in range(2)]
    for i in range(2):
        assert np.array_equal(np.concatenate([p[i]["inputs"] for p in parts]), whole[i]["inputs"])


def test_batch_not_divisible_by_processes():
    with pytest.raises(ZooDataError, match="global batch 6 is not divisible by process_count=4"):
        Batches(TOKENS, 16, 6, seed=0, process_index=0, process_count=4)
    with pytest.raises(ZooDataError, match="process_count=4"):
        eval_batches(TOKENS, 16, 6, 1, process_count=4)


def test_eval_batches_are_consecutive_windows_that_wrap():
    tokens = np.arange(50, dtype=np.uint16)  # (50 - 1) // 8 = 6 full windows
    batches = eval_batches(tokens, seq_len=8, global_batch=4, num_batches=3)
    starts = [b["inputs"][:, 0].tolist() for b in batches]
    assert starts == [[0, 8, 16, 24], [32, 40, 0, 8], [16, 24, 32, 40]]
    assert all(np.array_equal(b["targets"], b["inputs"] + 1) for b in batches)


def test_batches_from_a_real_store(tmp_path):
    tok, store = zstore.prepare(data_cfg(tmp_path, seq_len=32))
    x = Batches(store.train, 32, 4, seed=0)(0)
    rows = np.c_[x["inputs"], x["targets"][:, -1:]]
    windows = np.lib.stride_tricks.sliding_window_view(store.train, 33)
    assert all((windows == row).all(axis=1).any() for row in rows)  # each row is a window of the store
    with pytest.raises(ZooDataError, match="fewer than seq_len"):
        Batches(store.val[:10], 32, 4, seed=0)
