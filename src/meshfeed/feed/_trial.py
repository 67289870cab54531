"""A depth on trial, and how it is judged: ``Trial``; inline against reading ahead: ``Modes``.

``_climb`` moves the read-ahead's depth by trials. A trial keeps the windows measured
just before it at the old depth and those at the new one, and says whether it paid:
up, in rate beyond the noise of both, or the wait halved at no loss of rate; down, as
fast with no new wait, or faster beyond the noise. Inline (the consumer reads each
step itself) against a reader thread is a small difference in noisy windows, judged on
the medians of the recent windows of each mode rather than on one trial's two.
"""

from __future__ import annotations

import collections
import statistics

TRIAL_WINDOWS = 2  # windows a trial depth is judged on
WAIT_SHARE = 0.01  # the consumer's wait, over a window's time, that asks for a deeper trial
MIN_GAIN = 0.10  # a deeper trial pays only if its rate beats the old one by this, at least
MAX_MARGIN = 0.5  # the noise margin, at most (a doubling of a waiting source gains ~2x)
DOWN_LOSS = 0.05  # a shallower trial stays if its rate is within this of the old one
KEPT_RATES = 32  # window rates kept a mode (inline, reading ahead) to judge between them
NOISY = MAX_MARGIN / 2  # windows whose rates spread more than this judge nothing
EARLY_STEPS = 8  # a trial's first steps, after which one that clearly loses ends there
LOSING_WAIT = 0.1  # ... by waiting this share of them, and LOSING_FACTOR times the depth left
LOSING_FACTOR = 4
MAX_WAIT = 256  # windows before a trial after trials that went back: 1, doubling up to this


def spread(rates: list[float]) -> float:
    """The relative spread of a few rates: (max - min) / mean."""
    mean = sum(rates) / len(rates)
    return (max(rates) - min(rates)) / mean if mean > 0 else 0.0


class Trial:
    """A depth on trial: where it came from, and what the windows before it measured."""

    def __init__(self, was: int, depth: int, base: list[tuple[float, float]]) -> None:
        self.was = was
        self.depth = depth
        self.base = base
        self.windows: list[tuple[float, float]] = []  # (rate, wait share) at the new depth
        self.up = depth > was
        self.way = "up" if self.up else "down"
        self.inline = 0 in (was, depth)  # to or from inline, judged by ``Modes``

    def losing(self, steps: int, wait: float) -> bool:
        """Whether the trial's first ``EARLY_STEPS`` steps (``steps`` so far in its first
        window, ``wait`` of their time waiting) waited ``LOSING_WAIT`` of their time, and
        ``LOSING_FACTOR`` times what the windows before it waited: a depth too shallow
        for the source shows it at once, and each further step costs a wait. Trials down
        only, not to inline (which waits on every read by design): a deeper trial is
        there to cut a wait, and judged on rates."""
        if self.windows or not 0 < self.depth < self.was or steps != EARLY_STEPS:
            return False
        return wait >= max(LOSING_WAIT, LOSING_FACTOR * self.wait_before())

    def verdict(self, inline_faster: bool | None) -> tuple[bool, str, dict[str, float]]:
        """Whether the depth stays, how it was judged (``"paid"``, ``"did not pay"``,
        ``"too noisy to judge"``) and the rates judged. ``inline_faster``: for a trial
        to or from inline, what ``Modes`` says (``None``: too few windows yet)."""
        measured, noise = self.measured()
        if inline_faster is not None:  # whichever mode's windows ran faster lately
            stays = inline_faster == (self.depth == 0)
        elif noise > NOISY and not self.clear(measured):  # the windows disagree: no move
            return False, "too noisy to judge", measured
        elif self.inline:  # inline waits on every read by design: rates alone
            stays = measured["rate_after"] > measured["rate_before"] * (1 + measured["margin"] / 2)
        else:
            stays = self.paid(self.up, measured)
        return stays, "paid" if stays else "did not pay", measured

    def clear(self, m: dict[str, float]) -> bool:
        """Whether a trial up is clear however noisy its windows: each ran faster than
        every window before it, and the wait fell by more than half. (A waiting source
        back from a shallower trial refills in the windows before, which then spread;
        issue 75: 16 deep after 8 waited 34% at 175 steps/s, 32 deep 0.1% at 297, and
        went back as too noisy.)"""
        if not (self.up and self.base and self.windows):
            return False
        faster = min(r for r, _ in self.windows) > max(r for r, _ in self.base)
        return faster and m["wait_after"] < 0.5 * m["wait_before"]

    def wait_before(self) -> float:
        """The wait share of the windows before the trial (0 with none)."""
        return sum(w for _, w in self.base) / len(self.base) if self.base else 0.0

    def measured(self) -> tuple[dict[str, float], float]:
        """The mean rate and wait share before and after, the margin; and the noise."""
        base, new = [r for r, _ in self.base], [r for r, _ in self.windows]
        noise = max(spread(base), spread(new))
        measured = {
            "rate_before": sum(base) / len(base),
            "rate_after": sum(new) / len(new),
            "wait_before": self.wait_before(),
            "wait_after": sum(w for _, w in self.windows) / len(self.windows),
            "margin": min(MAX_MARGIN, max(MIN_GAIN, 2 * noise)),
        }
        return measured, noise

    @staticmethod
    def paid(up: bool, m: dict[str, float]) -> bool:
        """Whether what ``measured`` gave says the trial paid. Up: in rate, or half the
        wait taken away at no loss of rate. Down: as fast with no new wait, or faster
        beyond the noise."""
        if m["rate_after"] > m["rate_before"] * (1 + m["margin"]):
            return True
        if m["rate_after"] < m["rate_before"] * (1 - DOWN_LOSS):
            return False
        if up:
            return m["wait_after"] < 0.5 * m["wait_before"]
        # Down: under half the wait that calls a trial up (else the next window calls one,
        # and two depths each "pay" in turn), or, where the old depth waited that much
        # already, not half again its wait.
        waited = m["wait_before"] >= WAIT_SHARE
        return m["wait_after"] <= (1.5 * m["wait_before"] if waited else WAIT_SHARE / 2)


class Modes:
    """Window rates inline and reading ahead, the latest ``KEPT_RATES`` of each: inline
    against a reader thread is a small difference in noisy windows (0-30% in windows
    that spread ~20% here), judged on every window of both seen lately, not on the two
    of one trial."""

    def __init__(self) -> None:
        self._rates = {mode: collections.deque(maxlen=KEPT_RATES) for mode in (True, False)}
        self.inline_rate = 0.0  # the rate inline was last judged at

    def add(self, inline: bool, rate: float) -> None:
        self._rates[inline].append(rate)

    def forget(self) -> None:
        """What was measured is another loop's, or another source's."""
        for rates in self._rates.values():
            rates.clear()

    def leave_inline(self, rate: float, due: bool) -> bool:
        """Whether inline, at a window's ``rate``, tries reading ahead again: when a
        trial is ``due``, or the rate fell to half the one inline was kept at (not
        noise, nor a cold cache: the loop or the source changed, and what was measured
        before is forgotten)."""
        slower = rate < 0.5 * self.inline_rate
        if slower:
            self.forget()
        return slower or due

    def inline_faster(self) -> bool | None:
        """Whether inline's windows ran faster (medians: a pause or a trial's first
        windows do not decide); ``None`` until each mode has ``TRIAL_WINDOWS``."""
        if min(map(len, self._rates.values())) < TRIAL_WINDOWS:
            return None
        inline, ahead = (statistics.median(self._rates[mode]) for mode in (True, False))
        return inline > ahead


class Backoff:
    """When the next trial each way (``"up"``, ``"down"``) is due: windows after the
    last one that way ended, 1 at first and after a trial that stayed, twice as many
    after each that went back (at most ``MAX_WAIT``), so a run pays for failed trials
    less and less often, and a source that changes is followed both ways. A trial
    that stayed and was undone by one the other way that stayed too (2 deep, then 4
    again: two depths within the noise of each other) counts as one that went back."""

    def __init__(self) -> None:
        self.failed = {"up": 0, "down": 0}  # trials each way in a row that did not pay
        self._before = {"up": 0, "down": 0}  # ... before the last that stayed
        self.since = {"up": 0, "down": 0}  # windows since the last trial each way ended
        self._kept: tuple[int, int] | None = None  # the last trial that stayed: from, to

    def window(self) -> None:
        """A window went by."""
        self.since = {k: v + 1 for k, v in self.since.items()}

    def due(self, way: str) -> bool:
        return self.since[way] >= min(MAX_WAIT, 1 << self.failed[way])

    def ended(self, trial: Trial, stayed: bool) -> None:
        """``trial`` ended, its depth kept or not."""
        way = trial.way
        self.since[way] = 0
        if not stayed:
            self.failed[way] += 1
            return
        self._before[way], self.failed[way] = self.failed[way], 0
        if self._kept == (trial.depth, trial.was):  # it undid the last that stayed
            other = "down" if trial.up else "up"
            self.failed[other] = self._before[other] + 1
        self._kept = (trial.was, trial.depth)
