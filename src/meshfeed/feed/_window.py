"""What one window of a read-ahead's steps measured: ``Window``, which ``_climb`` judges by.

A window is at least ``MIN_WINDOW_STEPS`` steps and ``MIN_WINDOW_S`` seconds of the
consumer's. Its rate is its steps over their time: the consumer's waits on the
read-ahead in full, its own time a step (between handing a step out and asking for the
next) at most ``CLIP`` times the window's median (a loop that stops for an evaluation
or a checkpoint does not make the read-ahead look slow). Readers *wait* in a window
when their CPU time, summed, is under half the time some read was in flight; they
*sleep* when it is under ``SLEEP_SHARE`` of it: reads that queue for the GIL beside each
other can look as if they waited, not as if they slept (their CPU time is most of
what they got).
"""

from __future__ import annotations

import math
import statistics

MIN_WINDOW_S = 0.05  # the shortest window
MIN_WINDOW_STEPS = 16  # the fewest steps in a window
CLIP = 20  # a step counts at most this many times the window's median step time
SLEEP_SHARE = 0.25  # readers sleep when their CPU time is under this share of the reads' span


class Window:
    """What one window measured: the reads (CPU and wall time, the time some read was
    in flight) and the consumer's steps (its own time and its wait, the fewest steps
    ready at an ask). Its last close leaves what the climb judges by in ``own_s``,
    ``read_s``, ``least``, ``readers_wait`` and ``readers_sleep``."""

    def __init__(self, now: float) -> None:
        self._in_flight = 0
        self._last = now  # when the consumer last took a step
        self._own: list[float] = []  # the consumer's own time each step (not waiting)
        self._waits: list[float] = []
        self.own_s = self.read_s = 0.0
        self.least = 0
        self.readers_wait = self.readers_sleep = False
        self.reset(now)

    def reset(self, now: float) -> None:
        """Start a new window at ``now`` (a read in flight counts from now)."""
        self._from = self._span_from = now
        self._own.clear()
        self._waits.clear()
        self._close_at = MIN_WINDOW_STEPS
        self._least_ready = math.inf
        self._busy = self._wall = self._span = 0.0
        self._reads = 0

    def begin(self, now: float) -> None:
        if self._in_flight == 0:
            self._span_from = now
        self._in_flight += 1

    def read(self, now: float, wall_s: float, busy_s: float) -> None:
        self._wall += wall_s
        self._busy += busy_s
        self._reads += 1
        self._in_flight -= 1
        if self._in_flight == 0:
            self._span += now - self._span_from

    def reads_waited(self, now: float, share: float = 0.5) -> bool:
        """The reads so far spent more than ``1 - share`` of the time some read was in
        flight off the CPU (their CPU time summed: reads that queue for the GIL beside
        each other do not look like reads that wait)."""
        return self._reads > 0 and self._busy < share * self._in_flight_span(now)

    def _in_flight_span(self, now: float) -> float:
        return self._span + (now - self._span_from if self._in_flight else 0.0)

    def step(self, now: float, waited_s: float, ready: int) -> None:
        self._own.append(now - self._last - waited_s)
        self._waits.append(waited_s)
        self._last = now
        self._least_ready = min(self._least_ready, ready)

    def so_far(self) -> tuple[int, float]:
        """Steps taken in this window so far, and the share of their time spent waiting
        (the consumer's own time unclipped: a few steps have no median to clip by)."""
        waited = sum(self._waits)
        return len(self._waits), waited / max(sum(self._own) + waited, 1e-9)

    def full(self, now: float) -> bool:
        return len(self._own) >= self._close_at and now - self._from >= MIN_WINDOW_S

    def close(self, now: float) -> tuple[float, float] | None:
        """The window's (rate, wait share), or ``None`` while it is too short once the
        consumer's pauses are clipped; the readers' waiting is judged on it too."""
        most = CLIP * statistics.median(self._own)
        own = sum(min(t, most) for t in self._own)
        waited = sum(self._waits)
        spent = max(own + waited, 1e-9)
        if spent < MIN_WINDOW_S:  # a pause made it look long enough: go on
            self._close_at = len(self._own) + len(self._own) // 4 + 1
            return None
        self.readers_wait = self.reads_waited(now)
        self.readers_sleep = self.reads_waited(now, SLEEP_SHARE)
        self.own_s = own / len(self._own)
        self.read_s = self._wall / self._reads if self._reads else 0.0
        self.least = int(self._least_ready)
        window = (len(self._own) / spent, waited / spent)
        self.reset(now)
        return window
