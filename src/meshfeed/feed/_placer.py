"""Placing steps off the loop's thread: ``Placer``.

Placing a step -- collecting its rows from the record workers, putting them on the
devices -- was the loop thread's own work, one step after another. On a GPU that is a
host-to-device copy of every batch on one thread: ``jax.device_put`` of a numpy batch
ran at 5.75 GB/s on one thread of an H200 host and 15.9 GB/s on four, so one thread
capped the whole loader near 10k ImageNet-size images a second, however many cores
decoded. ``Placer`` runs the placing on a few threads of its own, each taking the next
step from the read-ahead in order and placing it while the others place theirs, and
hands placed batches out in step order: the loop's thread only takes finished steps.

At most ``threads`` steps are placed and not yet taken (device memory a few batches
deep). The threads place and never run a collective: ``check_replicas`` and everything
that must run in the same order on every process stays on the loop's thread. On CPU
devices the loader leaves this off by default (``place_threads="auto"``): rows reach
XLA:CPU without a copy there (lent, ``core._held``), so placing costs ~0.2 ms a step,
and placing on other threads beside a training step's all-reduce once made XLA:CPU's
collective miss participants (see ``_pipeline``).

An error in placing a step is raised on the loop's thread when it reaches that step;
``close`` stops the threads and drops what they placed, and the read-ahead with it.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from meshfeed.feed._pipeline import Inline, Prefetcher

Placed = tuple[Any, Any, Any]  # the batch, its HostStep, the read-ahead's ask


class _End:
    """The read-ahead ended (or failed, with ``error``) before this step."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


class Placer:
    """Yields ``(step, (batch, host step, ask))`` for each step of ``ahead``, placed by
    ``place(step, host)`` on ``threads`` threads, in step order."""

    def __init__(
        self,
        ahead: Inline | Prefetcher,
        place: Callable[[int, Any], tuple[Any, Any]],
        *,
        threads: int,
    ) -> None:
        if threads < 1:
            raise ValueError(f"Placer needs threads >= 1, got {threads}.")
        self._ahead = ahead
        self._place = place
        self._limit = threads
        self.next_step = ahead.next_step
        self.ask: Any = None
        self._claim = threading.Lock()  # one thread at a time takes the next step
        self._lock = threading.Lock()
        self._ready_cv = threading.Condition(self._lock)  # the consumer waits here
        self._room_cv = threading.Condition(self._lock)  # placers wait for room here
        self._ready: dict[int, Placed | _End] = {}
        self._claimed = self.next_step  # the next step a placer takes
        self._stopped = False
        self._threads = [
            threading.Thread(target=self._run, name="meshfeed-place", daemon=True)
            for _ in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def depth(self) -> int:
        return self._ahead.depth

    @property
    def peak_bytes(self) -> int:
        return self._ahead.peak_bytes

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._stopped and self._claimed - self.next_step >= self._limit:
                    self._room_cv.wait()
                if self._stopped:
                    return
            with self._claim:
                if self._stopped:
                    return
                try:
                    step, host = next(self._ahead)
                    ask = self._ahead.ask
                except StopIteration:
                    self._finish(self._claimed, _End())
                    return
                except BaseException as error:  # a read's error, raised at its step
                    self._finish(self._claimed, _End(error))
                    return
                with self._lock:
                    self._claimed = step + 1
            try:
                batch, done = self._place(step, host)
                item: Placed | _End = (batch, done, ask)
            except BaseException as error:  # raised on the loop's thread, at this step
                item = _End(error)
            self._finish(step, item)
            if isinstance(item, _End):
                return

    def _finish(self, step: int, item: Placed | _End) -> None:
        with self._lock:
            before = self._ready.get(step)
            if self._stopped or (isinstance(before, _End) and before.error is not None):
                return  # a step's error stays its outcome (the read-ahead ends after it)
            self._ready[step] = item
            self._ready_cv.notify_all()

    def __iter__(self) -> Iterator[tuple[int, Placed]]:
        return self

    def __next__(self) -> tuple[int, Placed]:
        with self._lock:
            step = self.next_step
            while step not in self._ready:
                if self._stopped:
                    raise StopIteration
                self._ready_cv.wait()
            item = self._ready.pop(step)
            if isinstance(item, _End):
                self._ready[step] = item  # the end stays the end
                if item.error is not None:
                    raise item.error
                raise StopIteration
            self.next_step = step + 1
            self.ask = item[2]
            self._room_cv.notify()
        return step, item

    def close(self) -> None:
        """Stops the threads, drops the placed steps, and closes the read-ahead."""
        if sys.is_finalizing():  # a loader never closed, at exit: the daemon readers are
            return  # frozen now, one may hold the lock (waiting on it hung the exit)
        with self._lock:
            self._stopped = True
            self._ready.clear()
            self._ready_cv.notify_all()
            self._room_cv.notify_all()
        self._ahead.close()  # wakes a placer waiting on it
        for thread in self._threads:
            thread.join(timeout=10.0)
