"""Host prefetch: read the next steps' rows on a background thread.

While the consuming thread places step ``k`` on the devices and dispatches its
computation, a thread reads and transforms the rows of the next steps, up to ``depth``
ahead. The thread does numpy work only and never calls JAX: a numpy gather, a ``pread``
and waiting on record-transform workers release the GIL, so reading runs on another
core, and placing the global ``jax.Array`` stays on the consuming thread, where JAX's
asynchronous dispatch already overlaps it with the previous step. (Placing on the
thread as well was tried. Besides making the consumer wait on a wake-up every step, it
made XLA:CPU's all-reduce in the main thread's step miss participants -- an abort after
40 s -- about once in 20 short trainings of 8 CPU devices; with the thread kept to numpy,
none in 120.)

Handoffs are what a thread costs: every sleep and wake-up is a context switch (5-10 us
here, as much as reading a small batch). So the reader fills the buffer to ``depth``
and then sleeps until the consumer has taken half of it, instead of waking for every
step; the consumer sleeps only when the buffer is empty. The consumer gets steps in
order, an error raised while reading is raised in the consumer (with its traceback),
and ``close`` stops the thread and drops what it read ahead, so nothing prefetched is
ever counted as consumed. The first step is produced before the thread starts, so an
error in it (output that cannot be placed, say) is raised before any thread exists.

``Inline`` is the same interface with no thread at all (``prefetch=0``), so the loader
has one iteration path whichever it uses.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterator
from typing import Any

_END = object()


class Inline:
    """Yields ``(step, produce(step))`` for ``step`` from ``start`` on, each on demand."""

    def __init__(self, produce: Callable[[int], Any], *, start: int) -> None:
        self._produce = produce
        self.next_step = start

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        return self

    def __next__(self) -> tuple[int, Any]:
        step = self.next_step
        item = (step, self._produce(step))
        self.next_step = step + 1
        return item

    def close(self) -> None:
        """Nothing to stop."""


class Prefetcher:
    """Yields ``(step, produce(step))`` for ``step`` in ``[start, end)``, produced ahead."""

    def __init__(
        self, produce: Callable[[int], Any], *, start: int, end: int | None, depth: int
    ) -> None:
        if depth < 1:
            raise ValueError(f"prefetch depth={depth} must be >= 1.")
        self.next_step = start
        self._produce = produce
        self._depth = depth
        self._refill_at = depth // 2  # the reader wakes when this many or fewer are left
        self._items: collections.deque[Any] = collections.deque()
        self._lock = threading.Condition(threading.Lock())
        self._reader_asleep = False
        self._consumer_asleep = False
        self._stopped = False
        if end is None or start < end:  # the first step here, before any thread
            self._items.append((start, produce(start)))
            start += 1
        self._thread = threading.Thread(
            target=self._run, args=(start, end), name="meshfeed-prefetch", daemon=True
        )
        self._thread.start()

    def _put(self, item: Any) -> bool:
        with self._lock:
            while len(self._items) >= self._depth and not self._stopped:
                self._reader_asleep = True
                self._lock.wait()
                self._reader_asleep = False
            if self._stopped:
                return False
            self._items.append(item)
            if self._consumer_asleep:
                self._lock.notify()
            return True

    def _run(self, start: int, end: int | None) -> None:
        step = start
        try:
            while end is None or step < end:
                if not self._put((step, self._produce(step))):
                    return
                step += 1
            self._put(_END)
        except BaseException as error:  # surfaced in the consumer, not lost in the thread
            self._put(error)

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        return self

    def __next__(self) -> tuple[int, Any]:
        with self._lock:
            while not self._items:
                self._consumer_asleep = True
                self._lock.wait()
                self._consumer_asleep = False
            item = self._items.popleft()
            if self._reader_asleep and len(self._items) <= self._refill_at:
                self._lock.notify()
        if item is _END:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        self.next_step = item[0] + 1
        return item

    def close(self) -> None:
        """Stops the thread and drops the batches it read ahead."""
        with self._lock:
            self._stopped = True
            self._items.clear()
            self._lock.notify_all()
        self._thread.join(timeout=10.0)
