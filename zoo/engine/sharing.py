"""The serving engine's side of prefix sharing (zoo.engine.batching.Engine; the pages and their store are
zoo.engine.pages): how much of a prompt the store holds, and a row's pages put into it."""

from __future__ import annotations

import numpy as np

from zoo.engine import pages

SHARED_MIN = 32  # the fewest stored prompt tokens worth taking (fewer: the prompt is prefilled whole, with others)


class Sharing:
    """The Engine's prefix-store calls (a mixin: it reads the Engine's book, prefix_cache, held and row_adapter)."""

    @staticmethod
    def _common(a: list[int], b: list[int]) -> int:
        """How many leading tokens two prompts share."""
        n = min(len(a), len(b))
        same = np.asarray(a[:n], np.int32) == np.asarray(b[:n], np.int32)
        return n if same.all() else int(np.argmin(same))

    def shared(self, prompt: list[int], adapter: int = 0) -> tuple[int, list[int]]:
        """(n, pages): the most leading tokens of `prompt` whose keys and values the prefix store holds in whole
        pages (at most all but its last, whose logits the prefill gives) under the same adapter, and those pages;
        (0, []) below SHARED_MIN or with the cache off."""
        keep = self.book.lookup(prompt[:-1], adapter) if self.prefix_cache else []
        n = len(keep) * pages.PAGE
        return (n, keep) if n >= SHARED_MIN else (0, [])

    def _store(self, row: int) -> None:
        """Row `row`'s whole pages of what it holds into the prefix store (with the cache on)."""
        if self.prefix_cache:
            self.book.store(row, self.held[row], int(self.row_adapter[row]))
