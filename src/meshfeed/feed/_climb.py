"""How deep "auto" reads ahead: the read-ahead's depth, climbing like TCP's slow start.

``Climb`` keeps what the choice needs -- the readers' CPU time since the last step up
and the time some read was in flight meanwhile, when the consumer last got a step, the
best steps per second seen and at which depth -- and says where to start (2, or 8 when
the first read mostly waited on a source), when to step up (the consumer waits on
readers that wait themselves; for a source, also as soon as the steps ahead no longer
hide a read) and by how much (twice; the first time, for a source, toward twice the
depth that hides a read, at most four times), and when to stop: when two doublings in a
row did not pay, it goes back to the best depth seen and stays. ``_pipeline``'s
``Prefetcher`` runs the threads.

Readers "wait" when their CPU time, summed over all of them, is under half the time in
which at least one read was in flight: a source that sleeps 20 ms a read, say. (Readers
never wait on record workers: they hand rows over and the consumer collects them.) Each
read's own wall time would mislead: sixteen readers of an in-memory array queue for the
GIL, so each read's wall time is sixteen times its CPU time, yet the readers together
keep a core busy the whole time and more of them cannot help.
"""

from __future__ import annotations

import math
import time

START_DEPTH = 2
START_DEPTH_WAITING = 8  # a source whose first read spent most of its time waiting
_MAX_FIRST_STEP = 4  # the first step up multiplies the depth by at most this
_MIN_WINDOW_S = 0.03  # the shortest stretch a doubling is judged on
FEED_DEPTH = 16  # the most steps "auto" reads ahead to keep record workers busy


class Climb:
    """The adaptive depth of one read-ahead."""

    def __init__(self, start: int) -> None:
        self.busy_s = self.wall_s = 0.0  # readers' CPU and wall time since the last step up
        self.reads = 0  # reads since the last step up
        self.span_s = 0.0  # time with a read in flight since the last step up
        self._in_flight, self._span_from = 0, 0.0
        self.handed = time.perf_counter()  # when the consumer last got a step
        self._since_step, self._since_s = start, time.perf_counter()  # the last step up
        self._best: tuple[float, int] | None = None  # the best steps per second, at a depth
        self._frozen = False
        self._strikes = 0
        self._fed_at = start  # the step the depth last grew to feed record workers at

    def begin(self) -> None:
        """A read starts (called under the read-ahead's lock, as ``read`` is)."""
        if self._in_flight == 0:
            self._span_from = time.perf_counter()
        self._in_flight += 1

    def read(self, wall_s: float, busy_s: float) -> None:
        """A read took ``wall_s`` seconds, ``busy_s`` of them on a CPU."""
        self.wall_s += wall_s
        self.busy_s += busy_s
        self.reads += 1
        self._in_flight -= 1
        if self._in_flight == 0:
            self.span_s += time.perf_counter() - self._span_from

    def _span(self) -> float:
        """The time with a read in flight, up to now."""
        now = time.perf_counter()
        return self.span_s + (now - self._span_from if self._in_flight else 0.0)

    def _waiting(self) -> bool:
        return self.reads > 0 and self.busy_s < 0.5 * self._span()

    def start_depth(self) -> int:
        """Where to start: deeper when the first read mostly waited on a source."""
        return START_DEPTH_WAITING if self._waiting() else START_DEPTH

    def wake_at(self, depth: int) -> int:
        """Steps left ahead at which idle readers wake: three quarters of the depth (a
        read that starts later than that may not be done in time on a busy host)."""
        return depth * 3 // 4

    def short_of_a_read(self, step: int, depth: int) -> bool:
        """Before the first step up from a source's start: the steps ahead will not hide
        a read (twice its wall time over the consumer's time a step)."""
        if self._best is not None or not self._waiting():
            return False
        if step <= self._since_step:
            return False  # no step of the consumer timed yet
        per_step = max(time.perf_counter() - self.handed, 1e-4)
        return 2 * self.wall_s / self.reads > depth * per_step

    def fed(self, depth: int, cap: int, next_step: int) -> int:
        """The depth to read at now that the consumer waited on record workers while
        some had nothing in hand: twice the depth (at most ``FEED_DEPTH``, within
        ``cap``), at most once per depth's worth of steps, so that each doubling is seen
        at work before the next. Steps in the workers' hands cost shared memory only,
        so there is no going back."""
        if next_step < self._fed_at + depth:
            return depth
        self._fed_at = next_step
        return max(depth, min(2 * depth, cap, FEED_DEPTH))

    def deeper(self, depth: int, cap: int, next_step: int, threads: int) -> int:
        """The depth to read at now that the consumer waits (or is about to).

        Twice the depth, if that is likely to help: only while the readers mostly wait
        themselves (more of them cannot help readers that compute), and only while
        doubling pays: the first doubling is free, and when the steps consumed per
        second since the last one grew by less than a quarter, twice in a row (reads
        take varying times: one window can mislead), the depth goes back to the best one
        seen and stays there.
        """
        if self._frozen or depth >= cap or not self._waiting():
            return depth
        now = time.perf_counter()
        steps, seconds = next_step - self._since_step, now - self._since_s
        first = self._best is None  # nothing to judge yet: the first doubling is free
        if not first and (steps < max(3, threads) or seconds < _MIN_WINDOW_S):
            return depth  # too little seen since the last doubling to judge it
        rate = 0.0 if first else steps / seconds
        factor = 2
        if first and self.reads:
            # Each step up of the climb costs a window of waiting: go toward the depth.
            hides = 2 * self.wall_s / self.reads / max(now - self.handed, 1e-4) / depth
            factor = max(2, min(_MAX_FIRST_STEP, 1 << max(0, math.ceil(hides) - 1).bit_length()))
        self._since_step, self._since_s = next_step, now
        self.busy_s = self.wall_s = self.span_s = 0.0
        self.reads = 0
        self._span_from = now
        if self._best is not None and rate < 1.25 * self._best[0]:
            self._strikes += 1  # the last doubling did not pay (yet)
            if self._strikes >= 2:
                self._frozen = True
                return self._best[1]
            return depth
        self._strikes = 0
        self._best = (rate, depth)
        return min(factor * depth, cap)
