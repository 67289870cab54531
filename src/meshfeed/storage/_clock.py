"""One clock per store: how long an outage is outlived, and who asks the store meanwhile.

A step reads many objects at once (every shard and field it touches, a few steps ahead),
often on several threads. When each read kept a deadline of its own, a store gone for
good was waited out once per read in a row: measured with ``retry_s=60``, the error
came after 181-231 s, and with ``retry_s=20`` a process still had none after 160 s. So
the time is the store's, not the read's: a ``StoreClock`` per store and process, shared
by every read in flight, counts the seconds since the store's first failure after its
last success; any success on that store stops it. ``retry_s`` is how long a store may
fail with no success in between, and once the clock passes it, every read waiting on
that store raises, naming its object, the seconds, the attempts and the last error.

While the store fails, the readers back off together instead of each hammering it:
one of them, the first to come after the shared delay (0.05 s, doubling up to 2 s),
asks the store (the *probe*); the others wait for its outcome. A failed probe sets the
next delay; a success wakes every reader to try again at once. Attempts that were in
flight when the outage began fail on their own and only add to the count. Every
``log_every_s`` (30 s) of an outage, one line on stderr says which object waits, the
last error, the time so far and when the readers will give up: one line per store, not
per reader.

A permanent error (a missing object, say) is no outcome here: the caller raises it, and
the clock only lets the next reader probe. ``clock_for(store)`` is the process's clock
of a store; what names a store is the caller's choice (``_remote`` says).
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
import time
from collections.abc import Iterator

LOG_EVERY_S = 30.0  # one line on stderr per this much of an outage
FIRST_DELAY_S = 0.05  # the first wait after a failure; then doubling
MAX_DELAY_S = 2.0  # the longest wait between two probes


class Attempt:
    """One try at the store, let through by ``StoreClock.attempt``: say how it went."""

    def __init__(self, clock: StoreClock, probe: bool) -> None:
        self.clock = clock
        self.probe = probe  # whether this try is the one that asks for every reader

    def succeeded(self) -> None:
        """The store answered (for part of a read, too): the outage, if any, is over."""
        self.clock._succeeded(self.probe)
        self.probe = False

    def failed(self, error: BaseException) -> None:
        """The store failed in a way that may pass (refused, reset, a timeout, a 5xx)."""
        self.clock._failed(error, self.probe)
        self.probe = False


class StoreClock:
    """The time one store has failed with no success, shared by every read of it.

    Args:
      store: what names the store in messages (``"s3 endpoint http://..."``, say).
      log_every_s: seconds of an outage between two lines on stderr (30).
    """

    def __init__(self, store: str, *, log_every_s: float = LOG_EVERY_S) -> None:
        if not log_every_s > 0:
            raise ValueError(f"log_every_s={log_every_s!r} must be > 0.")
        self.store = store
        self.log_every_s = log_every_s
        self._cond = threading.Condition()
        self._since: float | None = None  # the first failure since the last success
        self._delay = FIRST_DELAY_S  # the wait after the next failed probe
        self._probe_at = 0.0  # when the next probe may go
        self._probing = False  # a probe is in flight
        self._successes = 0
        self._attempts = 0  # failed attempts in this outage, every reader's
        self._error: BaseException | None = None  # the last of them
        self._next_log = math.inf

    @property
    def failing_for(self) -> float:
        """Seconds the store has failed with no success (0.0 while it works)."""
        with self._cond:
            return 0.0 if self._since is None else time.monotonic() - self._since

    @property
    def attempts(self) -> int:
        """Failed attempts in the outage now (0 while the store works)."""
        with self._cond:
            return self._attempts

    @contextlib.contextmanager
    def attempt(self, what: str, retry_s: float) -> Iterator[Attempt]:
        """Waits for this reader's turn at the store (at once while it works), then
        yields the ``Attempt`` to report on.

        Raises:
          OSError: the store has failed for ``retry_s`` with no success, naming ``what``.
        """
        try_ = Attempt(self, self._admit(what, retry_s))
        try:
            yield try_
        finally:
            if try_.probe:  # no outcome (a permanent error was raised): let another probe
                with self._cond:
                    self._probing = False
                    self._cond.notify_all()

    def _admit(self, what: str, retry_s: float) -> bool:
        """Whether this attempt is the probe; blocks while another reader probes."""
        with self._cond:
            successes = self._successes
            while self._since is not None and self._successes == successes:
                now = time.monotonic()
                failed_for = now - self._since
                if failed_for >= retry_s:
                    raise self._gave_up(what, retry_s, failed_for)
                if now >= self._next_log:
                    self._log(what, retry_s, failed_for)
                    while self._next_log <= now:
                        self._next_log += self.log_every_s
                if not self._probing and now >= self._probe_at:
                    self._probing = True
                    return True
                probe_at = math.inf if self._probing else self._probe_at
                wake = min(self._since + retry_s, self._next_log, probe_at)
                self._cond.wait(max(wake - now, 0.001))
            return False

    def _succeeded(self, probe: bool) -> None:
        with self._cond:
            self._successes += 1
            self._probing = self._probing and not probe
            if self._since is not None:
                self._since, self._error, self._attempts = None, None, 0
                self._delay, self._next_log = FIRST_DELAY_S, math.inf
            self._cond.notify_all()

    def _failed(self, error: BaseException, probe: bool) -> None:
        with self._cond:
            now = time.monotonic()
            self._attempts += 1
            self._error = error
            begins = self._since is None
            if begins:
                self._since, self._next_log = now, now + self.log_every_s
                self._delay = FIRST_DELAY_S
            if probe:
                self._probing = False
            if probe or begins:  # the first failure sets the first wait, a probe the next
                self._probe_at = now + self._delay
                self._delay = min(2 * self._delay, MAX_DELAY_S)
            self._cond.notify_all()

    def _last_error(self) -> str:
        error = self._error
        return "none" if error is None else f"{type(error).__name__}: {error}"

    def _gave_up(self, what: str, retry_s: float, failed_for: float) -> OSError:
        error = OSError(
            f"reading {what} failed: {self.store} has failed for {failed_for:.1f} s with no "
            f"success ({self._attempts} attempts); the last error: {self._last_error()}. "
            f"The store is unreachable or failing: check it (and storage_options), or pass "
            f"a larger retry_s (now {retry_s:g}) to outlive a longer outage."
        )
        error.__cause__ = self._error
        return error

    def _log(self, what: str, retry_s: float, failed_for: float) -> None:
        sys.stderr.write(
            f"meshfeed: {self.store} has failed for {failed_for:.0f} s ({self._attempts} "
            f"attempts), reading {what}; the last error: {self._last_error()}; giving up in "
            f"{max(retry_s - failed_for, 0):.0f} s (retry_s={retry_s:g}).\n"
        )
        sys.stderr.flush()


_clocks: dict[str, StoreClock] = {}
_clocks_lock = threading.Lock()


def clock_for(store: str) -> StoreClock:
    """This process's clock of ``store``, made on first use."""
    with _clocks_lock:
        clock = _clocks.get(store)
        if clock is None:
            clock = _clocks[store] = StoreClock(store)
        return clock
