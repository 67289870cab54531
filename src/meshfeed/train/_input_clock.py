"""The input clock: how long a training loop waits for its batches, and how far it runs
ahead of the devices.

JAX dispatches a step and returns, so the host reads and places the next batch while the
devices compute. The clock times each ``next(batches)`` and sorts the time two ways: all
of it is time in the loader (``loader_share``), and the part spent after the previous
step had finished (``jax.Array.is_ready`` on one of its outputs) is time the devices sat
idle (``wait_share``, an upper bound): the number that says whether loading keeps up.

It also keeps the loop at most two steps ahead of the devices. With more queued,
XLA:CPU's all-reduce on 8 CPU devices of a busy 2-core host sometimes never gathered its
participants (a rendezvous abort after 40 s, with or without a loader thread); with two,
none in 120 loaded runs.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import jax

from meshfeed.feed._loader import Loader
from meshfeed.train._step_parts import Batch


def endless(loader: Iterable[Batch]) -> Iterator[Batch]:
    """``loader``'s batches, its iterator started now; a ``Loader`` runs on into its next
    pass of epochs where its pass ends, any other iterable just ends."""
    return _passes(loader, iter(loader))


def _passes(loader: Iterable[Batch], iterator: Iterator[Batch]) -> Iterator[Batch]:
    while True:
        yield from iterator
        if not isinstance(loader, Loader):
            return
        iterator = iter(loader)


class InputClock:
    """Times a loop's ``next(batches)`` against its steps on the devices.

    Per step: ``batch = clock.next(batches)``, then ``clock.dispatch(step, state,
    batch)`` in place of ``step(state, batch)``.
    """

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.wait = 0.0
        """Seconds in ``next`` once the previous step had finished: the devices idle."""
        self.in_loader = 0.0
        """Seconds in ``next`` at all."""
        self.rows = 0
        """Rows of every batch so far (a batch size that ramps changes them by stage)."""
        self._previous: Any = None  # an output of the last step (is_ready is on arrays)
        self._in_flight: Any = None  # an output of the step before it

    def next(self, batches: Iterator[Batch]) -> Batch:
        """The next batch, timed; ``StopIteration`` where ``batches`` ends."""
        started = time.perf_counter()
        batch = next(batches)
        spent = time.perf_counter() - started
        self.in_loader += spent
        # While the previous step still computes, loading overlaps it: no one waits.
        if self._previous is None or self._previous.is_ready():
            self.wait += spent
        self.rows += len(next(iter(batch.values())))
        return batch

    def dispatch(self, step: Any, state: Any, batch: Batch) -> tuple[Any, Mapping[str, Any]]:
        """``step(state, batch)``, once at most one earlier step is still on the devices."""
        if self._in_flight is not None:
            self._in_flight.block_until_ready()
        state, metrics = step(state, batch)
        self._in_flight = self._previous
        self._previous = _an_output(metrics, state)
        return state, metrics

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def shares(self, elapsed: float) -> dict[str, float]:
        """Rows a second, and the shares of ``elapsed`` waited and spent in the loader."""
        if elapsed <= 0:
            return {"samples_per_s": 0.0, "input_wait_share": 0.0, "loader_share": 0.0}
        return {
            "samples_per_s": self.rows / elapsed,
            "input_wait_share": self.wait / elapsed,
            "loader_share": self.in_loader / elapsed,
        }


def _an_output(metrics: Mapping[str, Any], state: Any) -> Any:
    """One array the step produced, to ask later whether the step has finished."""
    for leaf in jax.tree_util.tree_leaves((metrics, state)):
        if isinstance(leaf, jax.Array):
            return leaf
    return None
