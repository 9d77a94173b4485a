"""Prefetching hands out exactly the batches of the requested steps and surfaces input errors."""

import pytest

from zoo.training.prefetch import Prefetcher


def test_prefetch_yields_each_step_in_order():
    with Prefetcher(lambda s: {"step": s}, 3, 9) as p:
        assert [p.get(s)["step"] for s in range(3, 9)] == list(range(3, 9))


def test_prefetch_raises_the_input_error_at_its_step():
    def make(s):
        if s == 2:
            raise ValueError("bad row at step 2")
        return s
    with Prefetcher(make, 0, 5) as p:
        assert p.get(0) == 0 and p.get(1) == 1
        with pytest.raises(ValueError, match="bad row at step 2"):
            p.get(2)
