"""A preemption notice on any process turned into one step at which every process stops.

A spot or preemptible machine (a Cloud TPU, a spot GPU, a Slurm job's preemption) gets
a SIGTERM and a grace period before it is taken. ``Preemption`` catches the signal and
answers ``reached(step)`` on every process of the job with ``True`` at one step, the
same everywhere, so that every process saves that step together and stops.

Alone, that step is the first one checked after the signal. With several processes the
watch's connections carry the agreement (``_watch``): the told process's watch thread
sends the notice to process 0's; process 0 asks every process which step it has
reached; each answers from its watch thread -- the last step its loop checked -- so an
answer never waits on a loop busy in a collective; and process 0 sends back the stop
step, one past the highest answer. A loop that checks a step past its answer before the
stop step arrives waits for it there (a round trip between the watches, milliseconds),
so no process can pass the stop step unknowing. The line each process prints says which
process was told and where they all stopped.

JAX's own preemption service (``multihost_utils.reached_preemption_sync_point``) agrees
on a step the same way, but it catches SIGTERM in C and says nothing of which process was
told; a Python handler, which this needs, replaces JAX's, so meshfeed's check is the one
to use in a loop that uses meshfeed's (``fit`` does).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Any

# The round's messages, a line each on the watch's connections: a notice (to process 0),
# its ask and the stop step (from it), each process's answer (to it).
NOTICE, ASK, ANSWER, STOP = b"n", b"a", b"r", b"t"
ROUND = (NOTICE, ASK, ANSWER, STOP)
_WAIT_S = 60.0
"""How long a loop waits at a step past its answer for the stop step before it is an
error (the watch ends a job whose process 0 is lost long before)."""


class Preemption:
    """This process's side of a preemption notice: ``reached(step)`` (see the module)."""

    def __init__(self, process_id: int = 0, num_processes: int = 1) -> None:
        self.process_id = process_id
        self.num_processes = num_processes
        self.told: int | None = None
        """The process that got the notice, once this process knows of it."""
        self.stop_at: int | None = None
        """The step every process stops at, once agreed."""
        self.signalled = False  # set by the handler: this process was told
        self._last = -1  # the last step reached() was asked about
        self._answer: int | None = None  # the step this process answered with
        self._answers: dict[int, int] = {}  # process 0: every process's answer
        self._noticed = False  # the watch has sent this process's notice on
        self._round: int | None = None  # process 0: the told process of the round begun
        self._lock = threading.Lock()
        self._decided = threading.Event()
        self._previous: Any = None
        self._installed = False
        # The handler writes a byte here, which wakes the watch's thread at once.
        self.wakeup, self._wake = os.pipe()
        os.set_blocking(self._wake, False)

    def install(self) -> bool:
        """Catches SIGTERM from now on (on the main thread only; elsewhere it cannot be,
        and ``False`` says so)."""
        if self._installed:
            return True
        if threading.current_thread() is not threading.main_thread():
            return False
        self._previous = signal.signal(signal.SIGTERM, self._on_signal)
        self._installed = True
        return True

    def uninstall(self) -> None:
        """Gives SIGTERM back to what handled it before (its default action, where that
        was a handler not set from Python, such as JAX's)."""
        if self._installed and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous or signal.SIG_DFL)
            self._installed = False

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.signalled = True  # the rest happens outside the handler, on the watch's thread
        with contextlib.suppress(OSError):
            os.write(self._wake, b"!")

    def reached(self, step: int) -> bool:
        """Whether ``step`` is the one to stop at, the same on every process; call it with
        every step, in order, after the step's work is dispatched."""
        with self._lock:
            self._last = step
            if self.num_processes == 1:
                if self.signalled and self.stop_at is None:
                    self.told, self.stop_at = self.process_id, step
                return step == self.stop_at
            must_wait = self._answer is not None and step > self._answer
        if must_wait and not self._decided.wait(_WAIT_S):
            raise RuntimeError(
                f"process {self.process_id} was told of a preemption but heard no step to stop "
                f"at within {_WAIT_S:.0f} s; process 0's watch is not answering."
            )
        return step == self.stop_at

    # The watch's side: what it hears, and what it sends (on process 0, to every process;
    # elsewhere, to process 0).

    def tick(self, *, hub: bool) -> list[bytes]:
        """What to send once this process was told (said once): process 0 begins the
        round itself, another process tells process 0."""
        with self._lock:
            if not self.signalled or self._noticed:
                return []
            self._noticed = True
        if hub:
            return self._begin(self.process_id)
        return [NOTICE + f"{self.process_id}\n".encode()]

    def heard(self, kind: bytes, text: str) -> list[bytes]:
        """One message of the round; what to send for it."""
        if kind == NOTICE:  # on process 0
            return self._begin(int(text))
        if kind == ASK:
            return [ANSWER + f"{self.process_id} {self._asked(int(text))}\n".encode()]
        if kind == ANSWER:  # on process 0
            who, _, step = text.partition(" ")
            return self._answered(int(who), int(step))
        stop_at, _, told = text.partition(" ")  # STOP
        self._decided_at(int(stop_at), int(told))
        return []

    def _begin(self, told: int) -> list[bytes]:
        """Process 0: a notice from ``told`` begins the round (a later one does not):
        every process is asked, and process 0 answers for itself."""
        if self._round is not None:
            return []
        self._round = told
        ask = ASK + f"{told}\n".encode()
        return [ask, *self._answered(self.process_id, self._asked(told))]

    def _asked(self, told: int) -> int:
        """Process ``told`` got a notice: this process's answer, its last step checked."""
        with self._lock:
            if self._answer is None:
                self.told, self._answer = told, self._last
            return self._answer

    def _answered(self, process_id: int, step: int) -> list[bytes]:
        """Process 0: one more answer; once all are in, the stop step, one past the
        highest, goes to every process."""
        self._answers[process_id] = step
        if len(self._answers) < self.num_processes or self._round is None:
            return []
        stop_at = max(self._answers.values()) + 1
        self._decided_at(stop_at, self._round)
        return [STOP + f"{stop_at} {self._round}\n".encode()]

    def _decided_at(self, stop_at: int, told: int) -> None:
        with self._lock:
            self.stop_at, self.told = stop_at, told
        self._decided.set()

    def stop(self) -> None:
        """Ends this process after the agreed step's save: its line on stderr, SIGTERM
        back to its earlier handler, and ``SystemExit(0)`` (exit handlers run: the
        watch's goodbye, JAX's shutdown)."""
        say(self.line())
        self.uninstall()
        raise SystemExit(0)

    def line(self) -> str:
        """What a process prints when it stops at the agreed step."""
        who = "this process" if self.told == self.process_id else f"process {self.told}"
        return (
            f"meshfeed: preempted: {who} (of {self.num_processes}) was told to stop "
            f"(SIGTERM); process {self.process_id} saved step {self.stop_at} and stops here. "
            "Run the same command again to resume from it."
        )


_preemption: Preemption | None = None


def preemption() -> Preemption:
    """This process's ``Preemption`` (made once, for the job's processes)."""
    global _preemption
    if _preemption is None:
        import jax

        _preemption = Preemption(jax.process_index(), jax.process_count())
    return _preemption


def say(text: str) -> None:
    sys.stdout.flush()
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
