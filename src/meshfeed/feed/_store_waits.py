"""How long a read-ahead's reads wait on a store behind a URL, or asleep: ``StoreWaits``,
which ``_climb`` keeps its floor by (``Floor``).

Each read tells the longest wait on a store inside it (``core._waits.timing_waits``:
the remote reads record their waits, on the reader's thread or on the remote pool's
threads, which run with the reader's context). The median of the last ``STORE_READS``
is the store's usual wait; steps in flight enough to cover it, one more than it over the
consumer's own time a step, keep it out of the consumer's way. The median, not the
tail: hedged reads (``storage._hedge``) cut the tail.

Reads that sleep (a database, a small store not behind a URL: their CPU time under
``SLEEP_SHARE`` of their wall time) keep a floor the same way, by their wall time, while
the readers sleep: 4 deep behind reads of 2 ms and steps of 2 ms, where 2 deep waited
1-2% of its windows (issue 60).
"""

from __future__ import annotations

import collections
import math
import statistics

from meshfeed.feed._window import SLEEP_SHARE

STORE_READS = 64  # reads whose waits on a store the store's usual wait is the median of
FLOOR_MOST = 16  # the highest floor: as deep as a start whose first reads waited


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


class Floor:
    """The least depth that keeps reads' usual wait out of the consumer's way: the
    store's (waits behind a URL) and, while the readers sleep, the sleeping reads'."""

    def __init__(self) -> None:
        self.store, self.sleeps = StoreWaits(), StoreWaits()

    def add(self, wall_s: float, busy_s: float, store_s: float) -> None:
        """A read took ``wall_s``, ``busy_s`` of it on a CPU, and waited ``store_s`` on a
        store behind a URL."""
        self.store.add(store_s)
        self.sleeps.add(wall_s if busy_s < SLEEP_SHARE * wall_s else 0.0)

    def depth(self, own_s: float, cap: int, sleeping: bool) -> tuple[int, str]:
        """The floor for a loop of ``own_s`` a step, within ``cap`` and 16, and why."""
        most = min(cap, FLOOR_MOST)
        store = self.store.floor(own_s, most)
        asleep = self.sleeps.floor(own_s, most) if sleeping else 0
        if store >= asleep:
            return store, self.store.why(own_s) if store else ""
        wait_ms, own_ms = statistics.median(self.sleeps.waits) * 1e3, own_s * 1e3
        return (
            asleep,
            f"up to the reads' floor: they sleep {wait_ms:.1f} ms, steps take {own_ms:.1f} ms",
        )
