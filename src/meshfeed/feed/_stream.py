"""The loader's moving part: its position, the steps read ahead, and the hand-out.

``Stream`` owns the position in the run (the global steps handed out) and hands out
placed batches from there, in step order, until the end of the run. Rows are read ahead
by a ``Prefetcher`` (or ``Inline`` with ``prefetch=0``); placing them on the devices and
``check_replicas`` stay on the consuming thread, in step order, because a collective
must run in the same order on every process. When the position moves under it
(``restore`` or ``reset`` between two batches) the read-ahead is dropped and restarted
at the new position, so nothing read ahead is ever counted as consumed -- nor its
skipped examples (``on_error="skip"``), which are counted as each step is handed out.
It also tells the watch what this process is doing, for the line a lost peer makes it
print.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import jax

from meshfeed.cluster._watch import doing
from meshfeed.core._waits import WAITS
from meshfeed.feed._pipeline import Inline, Prefetcher
from meshfeed.feed._placer import Placer
from meshfeed.feed._reader import HostStep
from meshfeed.feed._replicas import check_replicas
from meshfeed.feed._skips import SkipLog

GlobalBatch = dict[str, jax.Array]
CONSUMER = (
    "steps",
    "records",
    "wait_seconds",
    "next_seconds",
    "collect_seconds",
    "place_seconds",
    "asked",
    "ready",
    "steps_ready",
    "fill",
    "filtered",
)
"""The consumer's counts (``Stream.counts``), once a step: steps handed out, their
records (this process's, padding aside), seconds ``next()`` waited for the read-ahead,
seconds in ``next()``, seconds it waited for record workers' rows and placed them; the
asks of the read-ahead, those that found the step ready, the steps ready, and that over
the depth (at most 1); the examples the record transform dropped (returned None for)."""


class Stream:
    """Placed batches from ``step`` to ``end``, read ahead by ``prefetch`` steps."""

    def __init__(
        self,
        read: Callable[[int], Any],
        place: Callable[[int, Any], tuple[GlobalBatch, HostStep]],
        *,
        skips: SkipLog,
        end: int | None,
        prefetch: int | str,
        prefetch_bytes: int,
        check_every: int | None,
        step_bytes: int | None = None,
        steps_ahead: Callable[[], int | None] | None = None,
        place_threads: int = 0,
        starved: Callable[[], bool] | None = None,
        workers: bool = False,
    ) -> None:
        self._read = read
        self._place = place  # place also collects rows from record workers
        self._place_threads = place_threads  # > 0: a Placer places steps on its threads
        self._starved = starved  # record workers idled while rows were waited for
        self._workers = workers  # reads hand rows to record workers
        self._counts: list[float] = [0] * len(CONSUMER)  # the consumer's side, for stats()
        self.skips = skips
        self._step_bytes = step_bytes  # a step's host bytes, when known before reading
        self._steps_ahead = steps_ahead  # a bound on the depth, known after the first step
        self.end = end
        self._prefetch = prefetch
        self._budget = prefetch_bytes
        self._check_every = check_every
        self.step = 0
        self._ahead: Inline | Prefetcher | None = None
        self._live: set[Inline | Prefetcher | Placer] = set()  # the loops' read-aheads now
        self.closed = False

    def __iter__(self) -> Iterator[GlobalBatch]:
        ahead: Inline | Prefetcher | Placer | None = None
        try:
            while (self.end is None or self.step < self.end) and not self.closed:
                if ahead is None or ahead.next_step != self.step:  # or restore()/reset()
                    if ahead is not None:
                        ahead.close()
                        self._live.discard(ahead)
                    ahead = self._read_ahead()
                    if self._place_threads:
                        ahead = Placer(ahead, self._place, threads=self._place_threads)
                    self._live.add(ahead)
                doing(f"loading step {self.step}")
                began = time.perf_counter()
                try:
                    step, got = next(ahead)
                except StopIteration:
                    if self.closed:  # closed from outside the loop (the loader's close)
                        return
                    raise
                waited = time.perf_counter() - began
                if isinstance(ahead, Placer):  # placed on its threads, rows collected there
                    batch, done = got[0], got[1]
                else:
                    batch, done = self._place(step, got)
                self.skips.add(step, done.read, done.skipped)  # raises past max_skipped
                if self._check_every and step % self._check_every == 0:
                    check_replicas(batch)
                self.step = step + 1
                self._count(ahead.ask, done, waited, began, isinstance(ahead, Placer))
                if self._starved is not None and self._starved() and self._ahead is not None:
                    self._ahead.feed_workers()
                doing(f"running step {step} (its batch loaded)")
                WAITS.stepped(step)
                yield batch
        finally:
            if ahead is not None:
                ahead.close()
                self._live.discard(ahead)

    def close(self) -> None:
        """Stops every read-ahead's threads, also of loops not run to their end; a
        loop over the stream ends at its next step."""
        self.closed = True
        for ahead in list(self._live):
            ahead.close()
        self._live.clear()

    def _count(self, ask: Any, done: HostStep, waited: float, began: float, placed: bool) -> None:
        """One step handed out, in ``CONSUMER``'s order. Only the consuming thread writes
        these, so plain adds to a list do (a reader from another thread sees each
        amount whole): the cheapest counting there is, on the loop's own thread. With
        ``placed`` (a ``Placer``'s threads collected and placed the step) the loop
        waited only for the placed step: ``waited`` is all of its wait."""
        counts = self._counts
        counts[0] += 1
        counts[1] += done.read
        counts[2] += waited
        counts[3] += time.perf_counter() - began
        counts[4] += 0.0 if placed else done.collect_seconds
        counts[5] += done.place_seconds
        counts[10] += done.filtered
        if ask is not None:
            ready, steps_ready, depth = ask
            counts[6] += 1
            counts[7] += ready
            counts[8] += steps_ready
            counts[9] += min(1.0, steps_ready / depth) if depth else 0.0  # 0: inline

    def counts(self) -> dict[str, float]:
        """The consumer's counts (``CONSUMER``) since the stream was made."""
        return dict(zip(CONSUMER, self._counts, strict=True))

    def batch(self, step: int) -> GlobalBatch:
        """The placed batch of ``step``, read now, without moving the position."""
        return self._place(step, self._read(step))[0]

    def _read_ahead(self) -> Inline | Prefetcher:
        if self._prefetch == 0:
            self._ahead = Inline(self._read, start=self.step)
        else:
            self._ahead = Prefetcher(
                self._read,
                start=self.step,
                end=self.end,
                depth=None if self._prefetch == "auto" else int(self._prefetch),
                budget_bytes=self._budget,
                step_bytes=self._step_bytes,
                steps_ahead=self._steps_ahead,
                workers=self._workers,
            )
        return self._ahead

    @property
    def depth(self) -> int:
        """Steps read ahead now (0 before the first iteration)."""
        return 0 if self._ahead is None else self._ahead.depth

    @property
    def threads(self) -> int:
        """Threads reading ahead now."""
        return 0 if self._ahead is None else self._ahead.threads

    @property
    def moves(self) -> list[dict[str, Any]]:
        """With ``prefetch="auto"``, the read-ahead's last moves of its depth and why."""
        return [] if self._ahead is None else [dict(m) for m in self._ahead.moves]

    @property
    def peak_bytes(self) -> int:
        """The most bytes read ahead and not yet handed out, since the last iteration began."""
        return 0 if self._ahead is None else self._ahead.peak_bytes
