"""Values by key within a byte budget, the least recently used dropped first: ``SizedLRU``.

The loaded indexes of an indexed source (``index_bytes``) and the small files a process
holds past its bound of open files (``storage._handles``) are both kept this way.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

V = TypeVar("V")


class SizedLRU(Generic[V]):
    """Values by int key while their sizes (``size(value)``) sum to at most ``budget``;
    the least recently used dropped first, the newest always kept. Safe across threads."""

    def __init__(self, budget: int, size: Callable[[V], int]) -> None:
        self._budget = budget
        self._size = size
        self._lock = threading.Lock()
        self._values: collections.OrderedDict[int, tuple[V, int]] = collections.OrderedDict()
        self.bytes = 0  # the sizes of the values kept

    @property
    def budget(self) -> int:
        return self._budget

    def __len__(self) -> int:
        return len(self._values)

    def get(self, key: int) -> V | None:
        found = self._values.get(key)  # one C call: safe beside a writer under the lock
        if found is None:
            return None
        with self._lock:
            if key in self._values:
                self._values.move_to_end(key)
        return found[0]

    def put(self, key: int, value: V) -> None:
        """Keeps ``value`` (not when ``key`` is kept already: another thread put it)."""
        size = self._size(value)
        with self._lock:
            if key in self._values:
                return
            self._values[key] = (value, size)
            self.bytes += size
            while self.bytes > self.budget and len(self._values) > 1:
                _, (_, dropped) = self._values.popitem(last=False)
                self.bytes -= dropped

    def drop(self, key: int) -> None:
        with self._lock:
            found = self._values.pop(key, None)
            if found is not None:
                self.bytes -= found[1]

    def after_fork(self) -> None:
        """In a forked child: a lock of its own."""
        self._lock = threading.Lock()
