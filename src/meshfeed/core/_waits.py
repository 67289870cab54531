"""What this process waits on now, and the last step it handed out: for stall reports.

A process of a pod that is alive but stuck -- a storage read that never answers, say --
keeps sending heartbeats, so its peers wait in a collective with no word of which
process holds them up, or on what. ``WAITS`` is what it would say: every wait that may
stall (a read behind a URL) is recorded while it lasts (``waiting``: the stage, the
object, since when), with the step the loader last handed out (``stepped``).
``cluster``'s stall watch posts it to the job's coordination service and names a
process that waited too long. Recording a wait costs a dict insert and a removal.

``timing_waits`` also gives a block the seconds of each wait recorded inside it, on its
thread and on threads it hands work to with its context (``contextvars``): the
read-ahead learns from it how long a step's read waited on a store.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import threading
import time
from collections.abc import Iterator


class Waits:
    """The waits in flight (stage, object, since) and the last step with when it came."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waits: dict[int, tuple[str, str, float]] = {}
        self._tokens = itertools.count()
        self.step: int | None = None
        self.step_at = time.monotonic()

    @contextlib.contextmanager
    def waiting(self, stage: str, what: str) -> Iterator[None]:
        """Records a wait on ``what`` (``stage``: ``"reading"``, say) for the block."""
        token = next(self._tokens)
        with self._lock:
            self._waits[token] = (stage, what, time.monotonic())
        try:
            yield
        finally:
            with self._lock:
                stage, what, since = self._waits.pop(token)
            timed = _TIMED.get()
            if timed is not None:
                timed.append(time.monotonic() - since)

    def stepped(self, step: int) -> None:
        """The loader handed out ``step``."""
        self.step, self.step_at = step, time.monotonic()

    def longest(self) -> tuple[str, str, float] | None:
        """The wait in flight the longest: its stage, object and seconds so far."""
        with self._lock:
            if not self._waits:
                return None
            stage, what, since = min(self._waits.values(), key=lambda w: w[2])
        return stage, what, time.monotonic() - since


WAITS = Waits()
"""This process's waits and steps."""

_TIMED: contextvars.ContextVar[list[float] | None] = contextvars.ContextVar(
    "meshfeed_timed_waits", default=None
)


@contextlib.contextmanager
def timing_waits() -> Iterator[list[float]]:
    """The seconds of each wait recorded in the block (``WAITS.waiting``), appended as
    each ends: on this thread, and on threads that run work with its context."""
    timed: list[float] = []
    token = _TIMED.set(timed)
    try:
        yield timed
    finally:
        _TIMED.reset(token)
