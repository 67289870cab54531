"""How long a read-ahead's reads wait on a store behind a URL: ``StoreWaits``, which
``_climb`` keeps its store's floor by.

Each read tells the longest wait on a store inside it (``core._waits.timing_waits``:
the remote reads record their waits, on the reader's thread or on the remote pool's
threads, which run with the reader's context). The median of the last ``STORE_READS``
is the store's usual wait; steps in flight enough to cover it, one more than it over the
consumer's own time a step, keep it out of the consumer's way. The median, not the
tail: hedged reads (``storage._hedge``) cut the tail.
"""

from __future__ import annotations

import collections
import math
import statistics

STORE_READS = 64  # reads whose waits on a store the store's usual wait is the median of


class StoreWaits:
    """How long recent reads waited on a store behind a URL, and the depth that keeps
    its usual wait (their median) out of the consumer's way."""

    def __init__(self) -> None:
        self.waits: collections.deque[float] = collections.deque(maxlen=STORE_READS)
        self.reads = 0  # reads that waited on a store since the last window closed

    def add(self, store_s: float) -> None:
        if store_s > 0:
            self.waits.append(store_s)
            self.reads += 1

    def floor(self, own_s: float, most: int) -> int:
        """1 + the median wait over ``own_s``, the consumer's own time a step, at most
        ``most`` (0: no store, or no step measured yet)."""
        if not self.waits or own_s <= 0:
            return 0
        return min(most, 1 + math.ceil(statistics.median(self.waits) / own_s))

    def why(self, own_s: float) -> str:
        wait_ms, own_ms = statistics.median(self.waits) * 1e3, own_s * 1e3
        why = f"up to the store's floor: reads wait {wait_ms:.0f} ms on it"
        return f"{why}, steps take {own_ms:.1f} ms"
