"""Packing: variable-length examples laid into fixed rows of T positions, several per row, and the batches
cut from them.

An example is a pair of aligned arrays, `inputs` and `targets` (its tokens shifted by one) with a loss
weight per target. `first_fit_decreasing` lays the examples longest first, each into the first row with
room for it (a segment tree over the rows' free space finds it in O(log rows)); the plan depends only on
the lengths, so it is made once per dataset. A row carries, beside inputs / targets / weights,
`segment_ids` (1, 2, ... for its examples, 0 on the padding at its end) and `positions` (restarting at 0
at each example), from which the model keeps attention within each example (zoo.nn.attention) and
numbers positions per example. Unpacked, each example gets a row of its own (`one_per_row`).
"""

from __future__ import annotations

import numpy as np

from zoo.data.batches import EpochOrder, process_rows

FIELDS = ("inputs", "targets", "weights", "segment_ids", "positions")


def first_fit_decreasing(lengths, capacity: int) -> list[list[int]]:
    """Rows of example indices: each example (longest first; ties in index order) goes into the first row
    whose free space holds it, else into a new row. Every length must be in [1, capacity]."""
    lengths = np.asarray(lengths, np.int64)
    if len(lengths) and (lengths.min() < 1 or lengths.max() > capacity):
        raise ValueError(f"example lengths must be in [1, {capacity}]; got {lengths.min()}..{lengths.max()}")
    size = 1
    while size < max(len(lengths), 1):
        size *= 2
    free = np.zeros(2 * size, np.int64)  # leaves size..2size-1: each row's free space; inner nodes: the max
    rows: list[list[int]] = []
    for i in np.argsort(-lengths, kind="stable"):
        need = int(lengths[i])
        if free[1] >= need:  # walk down to the leftmost row with room
            node = 1
            while node < size:
                node = 2 * node if free[2 * node] >= need else 2 * node + 1
            r = node - size
        else:  # a new row
            r = len(rows)
            rows.append([])
            node = size + r
            free[node] = capacity
        rows[r].append(int(i))
        free[node] -= need
        node //= 2
        while node:
            free[node] = max(free[2 * node], free[2 * node + 1])
            node //= 2
    return rows


def one_per_row(n: int) -> list[list[int]]:
    return [[i] for i in range(n)]


class Examples:
    """Examples stored flat: inputs / targets (int32) and weights (float32) of example i lie at
    [offsets[i], offsets[i + 1])."""

    def __init__(self, inputs: list, targets: list, weights: list):
        self.lengths = np.asarray([len(x) for x in inputs], np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)])
        cat = lambda xs, dtype: np.concatenate(xs).astype(dtype) if xs else np.zeros(0, dtype)  # noqa: E731
        self.inputs, self.targets = cat(inputs, np.int32), cat(targets, np.int32)
        self.weights = cat(weights, np.float32)

    def __len__(self) -> int:
        return len(self.lengths)

    def rows(self, plan: list[list[int]], which, seq_len: int) -> dict[str, np.ndarray]:
        """The rows `which` (indices into `plan`; -1: an empty row) as [len(which), seq_len] arrays."""
        out = {k: np.zeros((len(which), seq_len), np.float32 if k == "weights" else np.int32) for k in FIELDS}
        for b, r in enumerate(which):
            at = 0
            for seg, i in enumerate(plan[r] if r >= 0 else (), start=1):
                lo, n = self.offsets[i], self.lengths[i]
                out["inputs"][b, at:at + n] = self.inputs[lo:lo + n]
                out["targets"][b, at:at + n] = self.targets[lo:lo + n]
                out["weights"][b, at:at + n] = self.weights[lo:lo + n]
                out["segment_ids"][b, at:at + n] = seg
                out["positions"][b, at:at + n] = np.arange(n)
                at += n
        return out


class PackedBatches:
    """step -> this process's rows of the global batch: the rows of `plan`, one permutation per epoch
    drawn from (seed, epoch), so the batch of a step is a pure function of (seed, step)."""

    def __init__(self, ex: Examples, plan: list[list[int]], seq_len: int, global_batch: int, seed: int,
                 process_index: int = 0, process_count: int = 1):
        self.ex, self.plan, self.seq_len = ex, plan, seq_len
        self.order = EpochOrder(len(plan), global_batch, seed)
        self.rows = process_rows(global_batch, process_index, process_count)

    def fixed_rows(self):
        """(n, of): the plan's n packed rows and of(idx) those rows' arrays (a cache keyed by row:
        zoo.tasks.teacher_cache)."""
        return len(self.plan), lambda idx: self.ex.rows(self.plan, np.asarray(idx), self.seq_len)

    def __call__(self, step: int) -> dict[str, np.ndarray]:
        return self.ex.rows(self.plan, self.order(step)[self.rows], self.seq_len)


def eval_batches(ex: Examples, plan: list[list[int]], seq_len: int, global_batch: int, num_batches: int,
                 process_index: int = 0, process_count: int = 1) -> list[dict[str, np.ndarray]]:
    """The first rows of `plan` in order, num_batches batches at most; a short last batch is filled with empty
    rows (weight 0)."""
    rows = process_rows(global_batch, process_index, process_count)
    out = []
    for b in range(min(num_batches, -(-len(plan) // global_batch))):
        pos = np.arange(b * global_batch, (b + 1) * global_batch)
        out.append(ex.rows(plan, np.where(pos < len(plan), pos, -1)[rows], seq_len))
    return out


def real_fraction(ex: Examples, plan: list[list[int]], seq_len: int) -> float:
    """The share of the rows' positions that hold an example's token."""
    return float(ex.lengths.sum()) / max(len(plan) * seq_len, 1)
