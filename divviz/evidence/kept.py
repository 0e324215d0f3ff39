"""Readings computed once for as long as the files they were read from stay as they are: a page's rerun that changes
no cell (another claim chosen, a table sorted) computes no cell again.

    KEPT = Kept()
    KEPT.get((what it is, *the identities of the files it reads), compute)   # a copy of compute()'s result

(a file's identity: `runs.tail.file_identity`)
"""

from __future__ import annotations

import copy
from typing import Callable


_NONE = object()  # no result kept under a key (a result may itself be None)


class Kept:
    """Results by key, at most `most` of them (all dropped when full: a key is the state of its files, so an old one
    is not asked for again); each caller gets its own copy to change."""

    def __init__(self, most: int = 64):
        self.most = most
        self.computed = 0  # how many times a result was computed (not found)
        self._known: dict = {}

    def get(self, key: tuple, compute: Callable[[], object]) -> object:
        """A copy of the result kept under `key`, computed now if none is (the server's warm-up thread and a page's
        may ask at once: each works on its own reference, so one's clearing cannot take the other's result away)."""
        value = self._known.get(key, _NONE)
        if value is _NONE:
            value = compute()
            if len(self._known) >= self.most:
                self._known.clear()
            self._known[key] = value
            self.computed += 1
        return copy.deepcopy(value)

    def __len__(self) -> int:
        return len(self._known)
