"""Hedged range reads: a read far slower than its store usually answers gets one duplicate.

At pod scale the slowest read of any host sets every host's step, and a store's tail is
long: against the local S3 server with 3% of range reads held 2 s, a run took 2.36x as
long as the clean one. So, as *The Tail at Scale* (Dean and Barroso) does, a range read
still unanswered after ``max(p95 x HEDGE_FACTOR, HEDGE_FLOOR_S)`` -- the p95 of the
store's recent answers -- is asked once more, and the first answer wins (the loser is
cancelled). The bytes are the same either way: the same range of the same object, and
the first read's size and ETag check stays where it was.

A ``Hedger`` per store (named as the retry clock names stores) keeps:

- the latencies of its last ``KEPT`` answers (a won duplicate's own, not the wait of the
  read it replaced) and their p95, computed again every ``MIN_LATENCIES`` answers; no
  hedge before the first ``MIN_LATENCIES``;
- a budget: duplicates at most ``BUDGET`` (5%) of the requests sent in the last
  ``WINDOW_S`` seconds;
- what an outage looks like: when the store's clock counts failures, or a quarter
  (``OUTAGE_SHARE``) of the reads in flight are past the hedge delay at once, it is not
  a tail, and no duplicate goes (the clock's one-probe rule does the asking then).

It counts duplicates sent and won in ``FETCHES`` (``hedges``, ``hedges_won``), which
``loader.stats()["source"]["url"]`` shows. ``hedge=False`` on a source turns it off.
Only filesystems with an asynchronous range read (s3fs, gcsfs, http) are hedged.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from meshfeed.storage._clock import StoreClock

HEDGE_QUANTILE = 0.95  # the latency a hedge waits on: this quantile of recent answers ...
HEDGE_FACTOR = 2.0  # ... times this
HEDGE_FLOOR_S = 0.05  # and never less than this (a store answering in 5 ms is not hedged at 10)
BUDGET = 0.05  # duplicates, at most this share of the requests sent in the last WINDOW_S
WINDOW_S = 30.0
MIN_LATENCIES = 32  # answers seen before any hedge, and between two quantiles computed
KEPT = 512  # answers whose latency the quantile is taken over
OUTAGE_SHARE = 0.25  # reads in flight past the hedge delay, of those in flight: an outage
MIN_OVERDUE = 4  # ... when at least this many are


class Hedger:
    """One store's recent latencies, hedge budget and reads in flight."""

    def __init__(self, clock: StoreClock) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._latencies: collections.deque[float] = collections.deque(maxlen=KEPT)
        self._fresh = 0  # answers since the quantile was computed
        self._delay: float | None = None  # seconds before a duplicate (None: not yet)
        self._sent: collections.deque[tuple[float, int, int]] = collections.deque()
        self._requests = self._hedges = 0  # in the window: (when, requests, hedges) summed
        self._flight: dict[int, float] = {}  # reads in flight: token -> when sent
        self._tokens = itertools.count()

    def delay(self) -> float | None:
        """Seconds a read waits before its duplicate (``None``: too few answers yet)."""
        return self._delay

    def sent(self, now: float) -> int:
        """A read sent now; its token for ``answered``."""
        token = next(self._tokens)
        with self._lock:
            self._flight[token] = now
            self._count(now, 1, 0)
        return token

    def answered(self, token: int, latency_s: float | None) -> None:
        """The read of ``token`` is over; ``latency_s``: an answer's, to learn from."""
        with self._lock:
            self._flight.pop(token, None)
            if latency_s is None:
                return
            self._latencies.append(latency_s)
            self._fresh += 1
            if self._fresh >= MIN_LATENCIES:
                self._fresh = 0
                ordered = sorted(self._latencies)
                p = ordered[min(len(ordered) - 1, int(HEDGE_QUANTILE * len(ordered)))]
                self._delay = max(p * HEDGE_FACTOR, HEDGE_FLOOR_S)

    def may_hedge(self, now: float) -> bool:
        """Whether a duplicate may go now (counted as sent when it may)."""
        if self.clock.failing_for > 0:
            return False  # an outage: the clock's probes ask the store
        with self._lock:
            self._count(now, 0, 0)
            if self._hedges + 1 > BUDGET * self._requests:
                return False
            delay = self._delay or 0.0
            overdue = sum(1 for t in self._flight.values() if now - t >= delay)
            if overdue >= MIN_OVERDUE and overdue >= OUTAGE_SHARE * len(self._flight):
                return False
            self._count(now, 0, 1)
            return True

    def _count(self, now: float, requests: int, hedges: int) -> None:
        if requests or hedges:
            self._sent.append((now, requests, hedges))
            self._requests += requests
            self._hedges += hedges
        while self._sent and self._sent[0][0] < now - WINDOW_S:
            _, r, h = self._sent.popleft()
            self._requests -= r
            self._hedges -= h


async def hedged_ranges(
    fs: Any, fs_path: str, starts: list[int], ends: list[int], hedger: Hedger, fetches: Any
) -> list[Any]:
    """``fs.cat_ranges`` (each range's bytes, or its exception), each range hedged."""

    def reader(start: int, end: int) -> Callable[[], Awaitable[Any]]:
        return lambda: fs._cat_file(fs_path, start=start, end=end)

    reads = (hedged(reader(s, e), hedger, fetches) for s, e in zip(starts, ends, strict=True))
    return list(await asyncio.gather(*reads))


async def hedged(make: Callable[[], Awaitable[Any]], hedger: Hedger, fetches: Any) -> Any:
    """What ``make()`` answers, asked once more (``make()`` again) when it is slow: the
    first answer, or the first read's exception when neither answered (returned)."""
    sent = time.monotonic()
    token = hedger.sent(sent)
    first = asyncio.ensure_future(make())
    tasks = {first}
    seconds = None
    latency = None
    try:
        delay = hedger.delay()
        while delay is not None and not first.done():  # asked again each delay, once sent
            await asyncio.wait(tasks, timeout=delay)
            if not first.done() and hedger.may_hedge(time.monotonic()):
                seconds = time.monotonic()
                tasks.add(asyncio.ensure_future(make()))
                fetches.add(hedges=1)
                break
        error: BaseException | None = None
        while tasks:
            done, tasks = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=lambda t: t is not first):  # the first read first
                failed = task.exception()
                if failed is None:
                    won = task is not first
                    if won:
                        fetches.add(hedges_won=1)
                    latency = time.monotonic() - (seconds if won and seconds else sent)
                    return task.result()
                if error is None or task is first:
                    error = failed
        return error
    finally:
        for task in tasks:
            task.cancel()
        hedger.answered(token, latency)


_hedgers: dict[str, Hedger] = {}
_hedgers_lock = threading.Lock()


def hedger_for(store: str, clock: StoreClock) -> Hedger:
    """This process's hedger of ``store``, made on first use."""
    with _hedgers_lock:
        hedger = _hedgers.get(store)
        if hedger is None:
            hedger = _hedgers[store] = Hedger(clock)
        return hedger
