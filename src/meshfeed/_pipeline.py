"""Host prefetch: build the next steps' batches on a background thread.

While the devices run step ``k`` (JAX dispatches asynchronously), a thread reads,
transforms and places the batches of steps ``k+1 .. k+depth``. The gather in numpy and
the transfers in JAX release the GIL, so this overlaps with the training loop's own
Python. The consumer always gets steps in order, an error raised while building a batch
is raised in the consumer (with its traceback), and ``close`` stops the thread and drops
what it built ahead, so nothing prefetched is ever counted as consumed.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

_END = object()


class Prefetcher:
    """Yields ``(step, produce(step))`` for ``step`` in ``[start, end)``, built ahead."""

    def __init__(
        self, produce: Callable[[int], Any], *, start: int, end: int | None, depth: int
    ) -> None:
        if depth < 1:
            raise ValueError(f"prefetch depth={depth} must be >= 1.")
        self._produce = produce
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(start, end), name="meshfeed-prefetch", daemon=True
        )
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

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
        item = self._queue.get()
        if item is _END:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        """Stops the thread and drops the batches it built ahead."""
        self._stop.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout=10.0)
