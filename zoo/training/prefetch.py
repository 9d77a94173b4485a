"""Host-to-device prefetch: a background thread builds and transfers the next batches while the
current step runs, so the step never waits on input. Batches depend only on the step number,
so prefetching changes nothing about which data a step sees."""

from __future__ import annotations

import queue
import threading
from typing import Callable


class Prefetcher:
    def __init__(self, make: Callable[[int], dict], start: int, stop: int, depth: int = 2):
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(make, start, stop), daemon=True)
        self._thread.start()

    def _run(self, make, start, stop):
        for step in range(start, stop):
            try:
                item = (step, make(step), None)
            except BaseException as e:  # surfaced in the consumer's thread
                item = (step, None, e)
            while not self._closed.is_set():
                try:
                    self._q.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if self._closed.is_set() or item[2] is not None:
                return

    def get(self, step: int) -> dict:
        got, batch, err = self._q.get()
        if err is not None:
            raise err
        assert got == step, (got, step)
        return batch

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)
