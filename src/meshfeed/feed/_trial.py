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


def spread(rates: list[float]) -> float:
    """The relative spread of a few rates: (max - min) / mean."""
    mean = sum(rates) / len(rates)
    return (max(rates) - min(rates)) / mean if mean > 0 else 0.0


class Trial:
    """A depth on trial: where it came from, and what the windows before it measured."""

    def __init__(self, was: int, base: list[tuple[float, float]]) -> None:
        self.was, self.base = was, base
        self.windows: list[tuple[float, float]] = []  # (rate, wait share) at the new depth

    def wait_before(self) -> float:
        """The wait share of the windows before the trial (0 with none)."""
        return sum(w for _, w in self.base) / len(self.base) if self.base else 0.0

    def measured(self) -> tuple[dict[str, float], float]:
        """The mean rate and wait share before and after, the margin; and the noise."""
        base, new = [r for r, _ in self.base], [r for r, _ in self.windows]
        noise = max(spread(base), spread(new))
        return {
            "rate_before": sum(base) / len(base), "rate_after": sum(new) / len(new),
            "wait_before": self.wait_before(),
            "wait_after": sum(w for _, w in self.windows) / len(self.windows),
            "margin": min(MAX_MARGIN, max(MIN_GAIN, 2 * noise)),
        }, noise  # fmt: skip

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

    def inline_faster(self) -> bool | None:
        """Whether inline's windows ran faster (medians: a pause or a trial's first
        windows do not decide); ``None`` until each mode has ``TRIAL_WINDOWS``."""
        if min(map(len, self._rates.values())) < TRIAL_WINDOWS:
            return None
        inline, ahead = (statistics.median(self._rates[mode]) for mode in (True, False))
        return inline > ahead
