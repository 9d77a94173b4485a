"""Deterministic batches: the batch of any step is a pure function of (seed, step), so resuming,
changing the process count or replaying a step gives the same data; each process keeps only its own
rows of the global batch (`process_rows`). `Batches` / `eval_batches` cut LM windows from a token
stream; `EpochOrder` walks example datasets (classification, seq2seq) one permutation per epoch.
"""

from __future__ import annotations

import numpy as np

from zoo.errors import ZooDataError


def process_rows(global_batch: int, process_index: int, process_count: int) -> slice:
    if not 0 <= process_index < process_count:
        raise ZooDataError(f"process_index={process_index} is outside [0, process_count={process_count})")
    if global_batch % process_count:
        raise ZooDataError(f"global batch {global_batch} is not divisible by process_count={process_count}; "
                           f"make train.batch_size a multiple of {process_count}")
    per = global_batch // process_count
    return slice(process_index * per, (process_index + 1) * per)


class EpochOrder:
    """Example indices of a step's global batch: one permutation per epoch, drawn from (seed, epoch),
    so every example is seen once per epoch and the batch of step s is a pure function of (seed, s)."""

    def __init__(self, n: int, global_batch: int, seed: int):
        if seed < 0:
            raise ZooDataError(f"seed={seed} must be >= 0 (train.seed)")
        self.n, self.global_batch, self.seed = n, global_batch, seed
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            if len(self._perms) > 4:  # a step spans at most two epochs: keep the cache small
                self._perms.clear()
            self._perms[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.n)
        return self._perms[epoch]

    def __call__(self, step: int) -> np.ndarray:
        pos = step * self.global_batch + np.arange(self.global_batch)
        return np.asarray([self._perm(int(p // self.n))[p % self.n] for p in pos])


def _check_tokens(tokens: np.ndarray, seq_len: int) -> None:
    if len(tokens) < seq_len + 1:
        raise ZooDataError(f"{len(tokens)} tokens are fewer than seq_len + 1 = {seq_len + 1}; "
                           f"lower data.seq_len or use a larger corpus")


def windows(tokens: np.ndarray, starts: np.ndarray, seq_len: int) -> dict[str, np.ndarray]:
    """The LM rows of `tokens` starting at `starts`: inputs, targets (shifted by one) and weights, [len(starts), seq_len]."""
    # One fancy index reads just these rows' pages from the memmap.
    rows_BT1 = np.asarray(tokens[starts[:, None] + np.arange(seq_len + 1)], dtype=np.int32)
    return {"inputs": np.ascontiguousarray(rows_BT1[:, :-1]),
            "targets": np.ascontiguousarray(rows_BT1[:, 1:]),
            "weights": np.ones((len(starts), seq_len), np.float32)}


class Batches:
    """Training batches: step -> this process's rows of the global batch, a pure function of (seed, step)."""

    def __init__(self, tokens: np.ndarray, seq_len: int, global_batch: int, seed: int,
                 process_index: int = 0, process_count: int = 1):
        _check_tokens(tokens, seq_len)
        if seed < 0:
            raise ZooDataError(f"seed={seed} must be >= 0 (train.seed)")
        self.tokens, self.seq_len, self.global_batch, self.seed = tokens, seq_len, global_batch, seed
        self.rows = process_rows(global_batch, process_index, process_count)

    def fixed_rows(self):
        """(n, of): the stream as n fixed rows, consecutive windows, and of(idx) those rows' arrays (a cache keyed by
        row: zoo.tasks.teacher_cache)."""
        T = self.seq_len
        return (len(self.tokens) - 1) // T, lambda idx: windows(self.tokens, np.asarray(idx) * T, T)

    def __call__(self, step: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([self.seed, step])
        # Every process draws the whole global batch so all agree on it, then keeps its own rows.
        starts = rng.integers(0, len(self.tokens) - self.seq_len, size=self.global_batch)
        return windows(self.tokens, starts[self.rows], self.seq_len)


def eval_batches(tokens: np.ndarray, seq_len: int, global_batch: int, num_batches: int,
                 process_index: int = 0, process_count: int = 1) -> list[dict[str, np.ndarray]]:
    """Fixed validation batches: consecutive windows from the start, wrapping around a short stream."""
    _check_tokens(tokens, seq_len)
    rows = process_rows(global_batch, process_index, process_count)
    n_windows = (len(tokens) - 1) // seq_len
    out = []
    for b in range(num_batches):
        window = np.arange(b * global_batch, (b + 1) * global_batch)[rows] % n_windows
        out.append(windows(tokens, window * seq_len, seq_len))
    return out
