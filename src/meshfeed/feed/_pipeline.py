"""Host prefetch: read the next steps' rows on background threads, several at once.

While the consuming thread places step ``k`` on the devices and dispatches its
computation, reader threads read and transform the rows of the next steps, each thread
its own step, up to ``depth`` steps ahead. The threads do numpy work only and never call
JAX: a numpy gather, a ``pread`` and a remote read release the GIL, so reading runs on
other cores, and placing the global ``jax.Array`` stays on the consuming thread, where
JAX's asynchronous dispatch already overlaps it with the previous step. (Placing on the
thread as well was tried. Besides making the consumer wait on a wake-up every step, it
made XLA:CPU's all-reduce in the main thread's step miss participants -- an abort after
40 s -- about once in 20 short trainings of 8 CPU devices; with the threads kept to
numpy, none in 120.) With record workers a read hands the rows to the workers and
returns at once (a pending step, released if it is dropped); the consumer
collects it when it places it, so no reader thread sits waiting on the workers.

Several steps in flight at once is what keeps a source that takes 2 ms or 20 ms per call
from capping the loader at one call per step. With ``depth=None`` ("auto") the depth
adapts. While the consumer reads the first step, the next ones are read beside it, 16
deep (within ``budget_bytes``, when the source's fields give a step's size before any
read: no transform, nothing ragged), so that a source that waits 20 ms a read has its
first steps ready together rather than one by one. Then it reads 2 ahead on one thread
(16, when the first reads spent most of their time waiting; the threads it no longer needs
end), and ``_climb`` moves the depth by trials judged on the steps per second measured
before and after, beyond their noise: deeper while the consumer waits on readers that
wait, shallower while readers compute or the steps ahead go unused, down to inline
(depth 0: the consumer reads each step itself while the readers sleep) -- within
``budget_bytes`` of batches ahead (the first batch's size tells how many), 128 steps
and 32 threads. Readers that compute (a numpy gather, a transform in this process) get
at most a thread a core: more only queue for the GIL, and 16 of them halved the rate of
an in-memory source here. New threads are started by a thread of their own: a start
waits for the new thread to run, which the consumer should not.

Handoffs are what a thread costs: every sleep and wake-up is a context switch (5-10 us
here, as much as reading a small batch). So idle readers sleep until the consumer has
taken a quarter of the steps ahead, instead of waking for every step; the consumer
sleeps only when its next step is not ready. The consumer gets steps in order (reads
may happen in any order), an error raised while reading is raised in the consumer (with
its traceback) when it reaches that step, and ``close`` stops the threads and drops
what they read ahead, so nothing prefetched is ever counted as consumed. An error in
the first step (output that cannot be placed, say) is raised from the constructor,
after it stopped the threads reading beside it.

``Inline`` is the same interface with no thread at all (``prefetch=0``), so the loader
has one iteration path whichever it uses.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from meshfeed.core._waits import timing_waits
from meshfeed.feed._climb import Climb

MAX_THREADS = 32
MAX_DEPTH = 4 * MAX_THREADS  # steps ahead, at most
_SPECULATE_DEPTH = 16  # read beside the first step, before knowing the source is slow


def nbytes(item: Any) -> int:
    """Bytes of the arrays in ``item`` (a list or dict of arrays, nested)."""
    if isinstance(item, dict):
        return sum(nbytes(v) for v in item.values())
    if isinstance(item, (list, tuple)):
        return sum(nbytes(v) for v in item)
    return int(getattr(item, "nbytes", 0))


def _drop(item: Any) -> None:
    """Lets go of an item read ahead and never handed out (rows in workers' hands)."""
    release = getattr(item, "release", None)
    if callable(release):
        release()


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def _cap(budget_bytes: int, item: Any, steps_ahead: Callable[[], int | None] | None) -> int:
    """The most steps ahead: ``budget_bytes`` of steps like ``item``, at most
    ``MAX_DEPTH`` and what ``steps_ahead`` allows."""
    cap = max(1, min(budget_bytes // max(1, nbytes(item)), MAX_DEPTH))
    bound = steps_ahead() if steps_ahead is not None else None
    return cap if bound is None else max(1, min(cap, bound))


class _Ready:
    """The steps read ahead and not taken yet, with their bytes (now, and at most), and
    the consumer waiting for the next one (``lock``: the read-ahead's, held by callers)."""

    def __init__(self, lock: threading.Lock) -> None:
        self._items: dict[int, tuple[Any, int]] = {}  # step -> (item, its bytes)
        self.bytes = self.peak_bytes = 0
        self._release = _drop  # held here: close() may run as the interpreter shuts down
        self._consumer = threading.Condition(lock)
        self._waiting = False  # the consumer is asleep in wait_for

    def __contains__(self, step: int) -> bool:
        return step in self._items

    def __len__(self) -> int:
        return len(self._items)

    def put(self, step: int, item: Any) -> None:
        size = nbytes(item)
        self._items[step] = (item, size)
        self.bytes += size
        self.peak_bytes = max(self.peak_bytes, self.bytes)

    def take(self, step: int) -> Any:
        item, size = self._items.pop(step)
        self.bytes -= size
        return item

    def wait_for(self, step: int, stopped: Callable[[], bool]) -> Any:
        """Takes ``step`` once it is read; ``StopIteration`` once ``stopped()`` (closed
        from another thread: a Placer's close)."""
        if step not in self._items:
            self._waiting = True
            while step not in self._items:
                if stopped():
                    raise StopIteration
                self._consumer.wait()
            self._waiting = False
        return self.take(step)

    def wake(self, everyone: bool = False) -> None:
        """Wakes the consumer if it waits (``everyone``: whether or not, on close)."""
        if everyone:
            self._consumer.notify_all()
        elif self._waiting:
            self._consumer.notify()

    def drop(self, item: Any = None) -> None:
        """Lets go of ``item`` (if given) and of every step held."""
        if item is not None:
            self._release(item)
        for held, _ in self._items.values():
            self._release(held)
        self._items.clear()
        self.bytes = 0


class Inline:
    """Yields ``(step, produce(step))`` for ``step`` from ``start`` on, each on demand."""

    depth = 0
    peak_bytes = 0
    ask = None
    threads = 0
    moves: tuple[dict[str, Any], ...] = ()

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

    def feed_workers(self) -> None:
        """No read-ahead to deepen (``prefetch=0``)."""

    def close(self) -> None:
        """Nothing to stop."""


def _read_first(prefetcher: Prefetcher, start: int) -> tuple[Any, float]:
    """The first step, read on the consumer's thread, and the process's CPU share
    meanwhile: reads that wait leave it idle, reads queueing for the GIL do not."""
    wall, cpu = time.perf_counter(), time.process_time()
    with prefetcher._lock:
        item = prefetcher._read(start)
        prefetcher._keep(start, item)
        prefetcher._claim = max(prefetcher._claim, start + 1)
    if isinstance(item, _Failed):
        prefetcher.close()
        raise item.error
    return item, (time.process_time() - cpu) / max(time.perf_counter() - wall, 1e-9)


class Prefetcher(Iterator[tuple[int, Any]]):
    """``(step, produce(step))`` for ``step`` in ``[start, end)``, read ``depth`` ahead
    (``None``: adapting, see above) on threads, ``produce`` called by several at once.
    ``steps_ahead`` bounds the depth once the first step is read (the record workers'
    shared memory); ``workers``: reads hand rows to record workers and return."""

    def __init__(
        self,
        produce: Callable[[int], Any],
        *,
        start: int,
        end: int | None,
        depth: int | None,
        budget_bytes: int,
        step_bytes: int | None = None,
        steps_ahead: Callable[[], int | None] | None = None,
        workers: bool = False,
    ) -> None:
        if depth is not None and depth < 1:
            raise ValueError(f"prefetch depth={depth} must be >= 1.")
        self.next_step = start
        self._produce = produce
        self.ask: tuple[bool, int, int] | None = None
        self._auto = depth is None
        self._lock = threading.Lock()
        self._readers = threading.Condition(self._lock)
        self._ready = _Ready(self._lock)
        self._idle = 0  # readers asleep
        self._stopped = False
        self._climb = Climb(time.perf_counter(), workers=workers)
        self._threads: list[threading.Thread] = []  # readers
        self._growers: list[threading.Thread] = []  # threads that start readers
        self._claim = start  # the next step a reader takes
        self._stop_at = end  # the end, or a step that failed
        self.depth = 1  # steps read ahead now (with "auto", what it has adapted to)
        if self._auto and step_bytes and (end is None or start < end):
            # The next steps read beside the first: a slow source's come ready together.
            self.depth = max(1, min(_SPECULATE_DEPTH, budget_bytes // step_bytes))
            self._claim += 1  # the first step is this thread's
            self._grow()
        item, cpu_share = _read_first(self, start) if end is None or start < end else (None, None)
        with self._lock:
            self._cap = _cap(budget_bytes, item, steps_ahead)
            if depth is None:
                self.depth = self._climb.start(time.perf_counter(), self._cap, start, cpu_share)
            else:
                self.depth = min(depth, self._cap)
            self._grow()
            if self._idle:
                self._readers.notify(self._idle)

    def _threads_wanted(self) -> int:
        """Reader threads for the depth ("auto": ``Climb.threads``, one asleep inline)."""
        return min(max(1, self._climb.threads()) if self._auto else self.depth, MAX_THREADS)

    @property
    def threads(self) -> int:
        """Reader threads now."""
        return len(self._threads)

    @property
    def moves(self) -> tuple[dict[str, Any], ...]:
        """With ``"auto"``, the depth's last moves and why (``Climb.moves``)."""
        with self._lock:
            return tuple(self._climb.moves) if self._auto else ()

    @property
    def peak_bytes(self) -> int:
        """The most bytes of steps read ahead and not taken yet, at once."""
        return self._ready.peak_bytes

    def _grow(self) -> None:
        """Starts readers up to the depth's on a thread of its own (a start waits ~0.1 ms)."""
        growing = self._growers and self._growers[-1].is_alive()
        if growing or len(self._threads) >= self._threads_wanted():
            return
        grower = threading.Thread(target=self._start_threads, name="meshfeed-prefetch", daemon=True)
        self._growers.append(grower)
        grower.start()

    def _start_threads(self) -> None:
        while True:
            with self._lock:
                if self._stopped or len(self._threads) >= self._threads_wanted():
                    return
                thread = threading.Thread(target=self._run, name="meshfeed-prefetch", daemon=True)
                self._threads.append(thread)
            thread.start()

    def _run(self) -> None:
        with self._lock:
            while True:
                while not self._stopped and (
                    (self._stop_at is not None and self._claim >= self._stop_at)
                    or self._claim - self.next_step >= self.depth
                ):
                    if len(self._threads) > max(1, self._threads_wanted()):
                        self._threads.remove(threading.current_thread())
                        return  # more threads than the depth needs (it started deeper)
                    self._idle += 1
                    self._readers.wait()
                    self._idle -= 1
                if self._stopped:
                    return
                step = self._claim
                self._claim += 1
                if not self._keep(step, self._read(step)):
                    return
                if step == self.next_step:
                    self._ready.wake()

    def _read(self, step: int) -> Any:
        """``produce(step)`` (or its error), timed for the climb, the lock let go meanwhile."""
        wall, busy = time.perf_counter(), time.thread_time()
        self._climb.begin(wall)
        self._lock.release()
        waits: list[float] = []  # on a store behind a URL
        try:
            with timing_waits() as waits:
                item = self._produce(step)
        except BaseException as error:  # surfaced in the consumer, not lost in the thread
            item = _Failed(error)
        finally:
            self._lock.acquire()
        now = time.perf_counter()
        self._climb.read(now, now - wall, time.thread_time() - busy, max(waits, default=0.0))
        return item

    def _keep(self, step: int, item: Any) -> bool:
        """Holds ``item`` as ``step``'s; ``False`` (dropped) when closed meanwhile."""
        if self._stopped:
            self._ready.drop(item)
            return False
        self._ready.put(step, item)
        if isinstance(item, _Failed) and (self._stop_at is None or step < self._stop_at):
            self._stop_at = step + 1
        return True

    def _set_depth(self, depth: int) -> None:
        """Reads ``depth`` steps ahead from now on, with the threads that takes."""
        if depth == self.depth == 0:
            return  # inline stays: no reader to wake or start (the consumer's every step)
        if depth != self.depth and self._idle:
            self._readers.notify(self._idle)
        self.depth = depth
        self._grow()

    def feed_workers(self) -> None:
        """The loop waited on idle record workers: "auto" reads deeper (``Climb.fed``)."""
        with self._lock:
            if self._auto:
                self._set_depth(self._climb.fed(self.next_step, time.perf_counter()))

    def __next__(self) -> tuple[int, Any]:
        with self._lock:
            step = self.next_step
            if self._stop_at is not None and step >= self._stop_at:  # the end, or past an error
                raise StopIteration
            self.ask = (step in self._ready, len(self._ready), self.depth)
            asked = time.perf_counter() if self._auto else 0.0
            if self.depth == 0 and self._claim <= step:  # inline: this thread reads it
                self._claim = step + 1
                item = self._read(step)  # not held as read ahead: it is taken now
                if self._stopped:  # closed meanwhile
                    self._ready.drop(item)
                    raise StopIteration
                if isinstance(item, _Failed):
                    self._stop_at = step + 1
            else:
                item = self._ready.wait_for(step, lambda: self._stopped)
            self.next_step = step + 1
            if self._auto:
                now = time.perf_counter()
                self._set_depth(self._climb.took(step, now, now - asked, self.ask[1]))
            # Idle readers wake at 3/4 of the depth left ahead (later may be too late).
            if self._idle and self.depth and self._claim - self.next_step <= self.depth * 3 // 4:
                self._readers.notify(self._idle)
        if isinstance(item, _Failed):
            raise item.error
        return step, item

    def close(self) -> None:
        """Stops the threads and drops the batches they read ahead."""
        if sys.is_finalizing():  # a loader never closed, at exit: the daemon readers are
            return  # frozen now, one may hold the lock (waiting on it hung the exit)
        with self._lock:
            self._stopped = True
            self._ready.drop()
            self._readers.notify_all()
            self._ready.wake(everyone=True)
        for group in (self._growers, self._threads):  # growers first: no reader starts after
            for thread in list(group):
                thread.join(timeout=10.0)
