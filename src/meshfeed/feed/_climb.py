"""How deep "auto" reads ahead, and on how many threads: trials judged on measured rates.

``Climb`` chooses the read-ahead's depth (steps read ahead) and bounds its reader
threads. It is driven by what the ``Prefetcher`` tells it -- reads starting and ending
(their wall and CPU time), and each step the consumer takes (when, how long it waited,
how many steps were ready) -- with the clock passed in, so tests drive it with
synthetic timings.

Why it is built this way (issue 49): the climb before this one settled 8 to 32 deep on
in-memory data in about one process of three, at half the speed of 2 deep. Three things
did it. Its first doubling was free and set the "best rate" to zero, so the rate at the
start depth was never measured and the climb could never come back to it. It judged
whether readers "wait" on one read, with other reads still in flight counted against
it, so a read that queued for the GIL beside fifteen others looked like a read waiting
on a slow store. And once deep enough that the consumer stopped waiting it never judged
again, so nothing brought it down. Deep itself costs nothing: 16 steps ahead on one or
two threads ran as fast as 2 ahead; it is the threads (8 to 16 of them queueing for the
GIL and the two cores) that halve the rate.

The rules now:

- Time is cut into *windows* of at least ``MIN_WINDOW_STEPS`` steps and
  ``MIN_WINDOW_S`` seconds. A window's rate is its steps over their time: the
  consumer's waits on the read-ahead in full, its own time a step (between handing a
  step out and asking for the next) at most ``CLIP`` times the window's median (a loop
  that stops for an evaluation or a checkpoint does not make the read-ahead look slow).
  Readers *wait* in a window when their CPU time, summed, is under half the time some
  read was in flight: a source that sleeps 20 ms a read. Readers that queue for the GIL
  can look the same, so this only says when a trial is worth making; the rates decide.
- A *trial* moves the depth and judges the move on ``TRIAL_WINDOWS`` windows, once the
  read-ahead has had the larger depth's worth of steps to fill or drain. It is compared
  with the windows just before it at the old depth, with the noise of both as margin:
  twice the larger relative spread of their rates, between ``MIN_GAIN`` and
  ``MAX_MARGIN``; windows that spread more than ``NOISY`` (another process taking the
  cores, say) judge nothing, and the depth goes back -- unless the trial was up and
  each of its windows ran faster than every one before, with the wait more than halved.
- Up, when the consumer waited ``WAIT_SHARE`` of a window on readers that wait: twice
  the depth (the first time, up to four times, toward twice a read's time over the
  consumer's own time a step). It stays if its rate beat the old one by the margin, or
  if it halved the wait with no loss of rate (within ``DOWN_LOSS``).
- Down, when the readers compute (the depth cannot help them: a start misjudged, a
  store that stopped waiting), when a window had three quarters of the depth ready at
  every ask (half the depth would still have had a quarter to spare), or right after a
  trial up did not pay where readers compute (not where a wait on readers that wait
  called it: shallower would only wait more): half the depth; below 2, *inline* (depth
  0: the consumer reads each step itself, no thread, no hand-off). It stays if its rate is within
  ``DOWN_LOSS`` of the old one with no new wait, or beat it by the margin. No new wait
  is under half ``WAIT_SHARE`` (else the next window calls a trial up, and two depths
  each "pay" in turn), or, where the old depth waited that much already, not half
  again its wait. A trial down whose first ``EARLY_STEPS`` steps (once the steps
  ahead have drained) waited ``LOSING_WAIT`` of their time, and ``LOSING_FACTOR``
  times what the depth it left waited, goes back there and then: a depth too shallow
  shows it at once, and every further step of it is a wait. Not with record workers:
  there a step "ready" is a step in the workers' hands, whose wait for rows the
  read-ahead does not see, and a step ahead costs shared memory only; the depth only
  grows there, doubled (to ``FEED_DEPTH`` at most) when the loop waited on
  workers that had nothing in hand (``fed``).
- Inline against reading ahead is judged on rates alone (inline waits on every read by
  design): on the medians of up to 32 recent windows of each (``Modes``, in ``_trial``), since the
  difference is small in noisy windows; until each has two, faster by half the margin.
  Inline beat a reader thread 2 deep by 1.03-1.7x here (1.14-1.37x in the median
  process) on rows in memory, memory-mapped and in a folder, where the thread's
  hand-offs and its queue for the GIL cost more than they hide; a gather that releases
  the GIL for long loses inline. Reads that wait get an inline trial only every
  ``MAX_WAIT`` windows. From inline the read-ahead comes back (16 deep when reads wait,
  else 2) when the rate falls to half the one inline was kept at, when reads wait (as
  often as trials up are due), and every ``MAX_WAIT`` windows to check.
- A trial that went back makes the next one the same way wait twice as many windows
  (from one, at most ``MAX_WAIT``); one that stayed resets the wait. A run pays for
  failed trials less and less often, and a source that changes is followed both ways.
- Threads follow the depth, so a trial runs as the fixed depth would: readers that
  *sleep* (their CPU time under ``SLEEP_SHARE`` of the time a read was in flight: a
  database, a small store) get one a step, as ``prefetch=N`` reads N deep; others one
  fewer than the depth (a step stays ready while one is read), and at most one a core
  when they compute. (Issue 60: a trial 2 deep on one thread kept one 2 ms read in
  flight and waited half its time, where ``prefetch=2`` waited under 1%. GIL-bound
  readers that only look waiting get no thread a step: more threads would make them
  look more so.)
- A store behind a URL (issue 51): each read tells how long it waited on a store (its
  longest wait, ``core._waits.timing_waits``). Reads that wait on a store wait, whatever
  the process's CPU does meanwhile (a client signing requests, decoding answers): they
  start ``START_DEPTH_WAITING`` deep and get a thread a step. And the depth never stays
  below the *store's floor*: one step more than the store's usual wait (the median of
  the last reads' waits, ``_store_waits``) over the consumer's own time a step, at most
  ``START_DEPTH_WAITING``; below it, the depth moves up to it at the next window, and
  no trial goes under it. The median, not the tail: hedged reads cut the tail. Reads
  that sleep keep such a floor too, by their own time, while the readers sleep
  (``Floor``, issue 60): 2 deep behind reads of 2 ms and steps of 2 ms waited 1-2%.

Every move is kept in ``moves`` (the step, the depth before and after, why, and the
rates judged), which ``loader.stats()`` shows.
"""

from __future__ import annotations

import collections
import math
import os
from typing import Any

from meshfeed.feed._store_waits import Floor
from meshfeed.feed._trial import MAX_WAIT, TRIAL_WINDOWS, WAIT_SHARE, Backoff, Modes, Trial
from meshfeed.feed._window import MIN_WINDOW_STEPS, Window

START_DEPTH = 2  # also the least "auto" reads ahead: one reader thread and a step ready
START_DEPTH_WAITING = 16  # first reads that waited: as deep as they were read (_SPECULATE_DEPTH)
FEED_DEPTH = 16  # the most steps "auto" reads ahead to keep record workers busy
_MAX_FIRST_STEP = 4  # the first trial up multiplies the depth by at most this
_KEPT = 16  # moves kept for stats()


def available_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _up_factor(first: bool, window: Window, depth: int) -> int:
    """Twice; the first time, up to four times, toward twice a read over a step."""
    own_s, read_s = window.own_s, window.read_s
    if not first or own_s <= 0:
        return 2
    hides = 2 * read_s / own_s / depth
    return max(2, min(_MAX_FIRST_STEP, 1 << max(0, math.ceil(hides) - 1).bit_length()))


def _rounded(rates: dict[str, float]) -> dict[str, float]:
    """The rates a move was judged on, as ``stats()`` shows them: wait shares to 4
    places, the margin to 3, rates to 2."""
    return {k: round(v, 4 if "wait" in k else 3 if k == "margin" else 2) for k, v in rates.items()}


class Climb:
    """The adaptive depth of one read-ahead (see the module's docstring).

    Every method takes ``now`` (``time.perf_counter()`` in the ``Prefetcher``) and is
    called under the read-ahead's lock.
    """

    def __init__(self, now: float, *, workers: bool = False, cores: int | None = None) -> None:
        self._cores = cores or available_cores()
        self._workers = workers  # reads hand rows to record workers: no trials down
        self._window = Window(now)
        self.depth = START_DEPTH
        self._cap = START_DEPTH  # the most steps the read-ahead may hold (start())
        self.readers_wait = self.readers_sleep = False
        self._held: list[tuple[float, float]] = []  # (rate, wait share) at this depth
        self._trial: Trial | None = None
        self._settle = 0  # steps to let go by before the next window counts
        self._due = Backoff()  # when the next trial each way is due
        self._first_up = True
        self._fed_at = 0  # the step the depth last grew to feed record workers at
        self._modes = Modes()
        self._floor = Floor()  # a store's wait, or sleeping reads', kept in flight
        self._store = self._floor.store
        self.moves: collections.deque[dict[str, Any]] = collections.deque(maxlen=_KEPT)

    # Reads, from the readers' threads.

    def begin(self, now: float) -> None:
        """A read starts."""
        self._window.begin(now)

    def read(self, now: float, wall_s: float, busy_s: float, store_s: float = 0.0) -> None:
        """A read took ``wall_s`` seconds, ``busy_s`` of them on a CPU, and waited
        ``store_s`` on a store behind a URL (its longest wait)."""
        self._window.read(now, wall_s, busy_s)
        self._floor.add(wall_s, busy_s, store_s)

    def floor(self) -> tuple[int, str]:
        """The least depth that keeps reads' usual wait out of the loop's way, and why."""
        return self._floor.depth(self._window.own_s, self._cap, self.readers_sleep)

    # The depth.

    def start(self, now: float, cap: int, step: int, cpu_share: float | None = None) -> int:
        """The depth to read at once the first step is read, within ``cap`` steps; the
        first reads waited when the process used under half a core while the first was
        read (``cpu_share``), or, without it, by the window's reads."""
        self._cap = max(1, cap)
        waited = self._window.reads_waited(now) if cpu_share is None else cpu_share < 0.5
        self.readers_wait = self.readers_sleep = waited or bool(self._store.reads)
        start = START_DEPTH_WAITING if self.readers_wait else START_DEPTH
        why = "start: the first reads waited" if self.readers_wait else "start"
        why += " on a store" if self._store.reads else ""
        self._move(step, min(start, self._cap), why, now)
        return self.depth

    def threads(self) -> int:
        """Reader threads for this depth: one a step for readers that sleep (every step
        ahead a read in flight, as ``prefetch=depth`` reads), else one fewer than the
        depth (a step stays ready while one is read), at most one a core for readers
        that compute; none inline."""
        if self.depth == 0:
            return 0
        if self.readers_sleep:
            return self.depth
        return max(1, min(self.depth - 1, self.depth if self.readers_wait else self._cores))

    def fed(self, step: int, now: float) -> int:
        """The consumer waited on record workers while some had nothing in hand: twice
        the depth (at most ``FEED_DEPTH``, within the cap), at most once per depth's
        worth of steps, so that each doubling is seen at work before the next."""
        if step < self._fed_at + self.depth or self._trial is not None:
            return self.depth
        self._fed_at = step
        depth = max(self.depth, min(2 * self.depth, self._cap, FEED_DEPTH))
        if depth != self.depth:
            self._move(step, depth, "feeding record workers that had nothing in hand", now)
        return self.depth

    def took(self, step: int, now: float, waited_s: float, ready: int) -> int:
        """The consumer took ``step`` at ``now`` after waiting ``waited_s`` for it, with
        ``ready`` steps ready when it asked; returns the depth to read at."""
        self._window.step(now, waited_s, ready)
        if self._settle > 0:  # the read-ahead still fills or drains after a move
            self._settle -= 1
            if self._settle == 0:
                self._window.reset(now)
            return self.depth
        trial = self._trial
        if trial is not None and trial.losing(*self._window.so_far()):
            rates = {"wait_before": trial.wait_before(), "wait_after": self._window.so_far()[1]}
            self._back(step, trial, "lost early", now, rates)
            return self.depth
        if not self._window.full(now):
            return self.depth
        window = self._window.close(now)
        if window is None:
            return self.depth
        self.readers_wait = self._window.readers_wait or self._store.reads > 0
        self.readers_sleep = self._window.readers_sleep or self._store.reads > 0
        self._store.reads = 0
        self._modes.add(self.depth == 0, window[0])
        self._due.window()
        floor, why = self.floor()
        if self._trial is None and self.depth < floor:
            self._move(step, floor, why, now)
        elif self._trial is None:
            self._hold(step, window, now)
        else:
            self._judge(step, window, now)
        return self.depth

    def _hold(self, step: int, window: tuple[float, float], now: float) -> None:
        """A window at a settled depth: start a trial up or down, or hold."""
        self._held = [*self._held[-1:], window]
        if self.depth == 0:  # inline: read ahead again when the rate fell from the one
            # inline was kept at (the loop or the source changed), when reads wait (as
            # often as trials up are due), or every MAX_WAIT windows, to check
            due = self._due.due("up") if self.readers_wait else self._due.since["up"] >= MAX_WAIT
            if self._modes.leave_inline(window[0], due):  # as deep as a start whose first
                # reads waited, if they do
                depth = START_DEPTH_WAITING if self.readers_wait else START_DEPTH
                self._try(step, min(self._cap, depth), now)
            return
        if window[1] >= WAIT_SHARE and self.readers_wait and self.depth < self._cap:
            if self._due.due("up"):
                deeper = _up_factor(self._first_up, self._window, self.depth) * self.depth
                self._try(step, min(self._cap, deeper), now)
        elif not self.readers_wait or 4 * self._window.least >= 3 * self.depth:
            # Readers that compute gain nothing from the depth (a start misjudged, a
            # store that stopped waiting); or half the depth would have had a quarter
            # of it to spare.
            self._try_down(step, now)

    def _try_down(self, step: int, now: float) -> None:
        if self._workers:  # a step ahead is a step in the workers' hands: shared memory only
            return
        if self.depth > 0 and self._due.due("down"):
            half = self.depth // 2  # below START_DEPTH: inline (the consumer reads);
            # for reads that wait, only every MAX_WAIT windows (inline waits them all);
            # never under the store's floor
            if half < self.floor()[0]:
                return
            if half >= START_DEPTH or not self.readers_wait or self._due.since["down"] >= MAX_WAIT:
                self._try(step, half if half >= START_DEPTH else 0, now)

    def _try(self, step: int, depth: int, now: float) -> None:
        was = self.depth
        self._trial = Trial(was, depth, list(self._held))
        self._due.since["up" if depth > was else "down"] = 0  # due counts from its end
        why = "trial deeper" if depth > was else "trial shallower"
        if 0 in (was, depth):
            why = "trial inline" if depth == 0 else "trial reading ahead"
        self._move(step, depth, why, now)

    def _judge(self, step: int, window: tuple[float, float], now: float) -> None:
        trial = self._trial
        assert trial is not None
        trial.windows.append(window)
        if len(trial.windows) < TRIAL_WINDOWS:
            return
        stays, why, rates = trial.verdict(self._modes.inline_faster() if trial.inline else None)
        if trial.inline:
            self._modes.inline_rate = rates["rate_after" if self.depth == 0 else "rate_before"]
        if not stays:
            self._back(step, trial, why, now, rates)
            return
        self._end(trial, stayed=True)
        self._held = list(trial.windows)
        self._note(step, trial.was, self.depth, f"kept: {trial.way} paid", rates)

    def _end(self, trial: Trial, *, stayed: bool) -> None:
        """The trial is over: the next one its way is due from now (``Backoff``)."""
        self._due.ended(trial, stayed)
        self._first_up = self._first_up and not trial.up
        self._trial = None

    def _back(self, step: int, trial: Trial, why: str, now: float, rates: dict) -> None:
        """The trial did not pay: back to its depth."""
        self._end(trial, stayed=False)
        self._move(step, trial.was, f"back: {trial.way} {why}", now, rates)
        self._held = list(trial.base)
        if trial.up and not self.readers_wait:  # deeper did not pay: maybe shallower
            self._try_down(step, now)  # does (a start misjudged); not where the wait that
            # called the trial was on readers that wait: shallower only waits more

    def _move(
        self, step: int, depth: int, why: str, now: float, rates: dict[str, Any] | None = None
    ) -> None:
        was, self.depth = self.depth, depth
        # The steps ahead fill or drain; to or from inline, a window's worth more: the
        # first steps after the switch ran ~20% slower here, whichever way it went.
        self._settle = max(was, depth) + (MIN_WINDOW_STEPS if 0 in (was, depth) else 0)
        self._held = []
        self._window.reset(now)
        self._note(step, was, depth, why, rates)

    def _note(self, step: int, was: int, depth: int, why: str, rates: dict | None) -> None:
        move = {"step": step, "depth": depth, "was": was, "why": why}
        self.moves.append({**move, **_rounded(rates or {})})
