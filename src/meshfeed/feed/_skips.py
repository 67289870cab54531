"""The examples a loader skipped (``on_error="skip"``), and the budget that bounds them.

A skipped example keeps its row in the batch, masked like a padding row, so the batch's
shape, the schedule and every other row stay as they were: the output is the same for
any number of workers, threads or processes, and ``state()`` / ``restore`` stay exact.
What a skip must not do is go unnoticed: a record transform with a bug, or a shard that
is all garbage, would otherwise train on masked batches in silence. So the loader
counts, on each process, the examples it read and skipped in the steps it handed out
(steps read ahead and dropped are not counted), and raises once it has skipped more
than ``max_skipped``: a count, or a fraction of the examples read -- by default
``DEFAULT_MAX_SKIPPED``, 1%, and never fewer than ``GRACE`` examples, so that a few
bad records early in a run pass. The list of skipped examples is bounded by the same
budget (about 100 bytes an entry).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from meshfeed.data._bad_records import Skip

DEFAULT_MAX_SKIPPED = 0.01
GRACE = 100  # a fraction of the examples read allows at least this many skipped
_SHOWN = 3  # skipped examples the budget's error names


class Skipped(NamedTuple):
    """An example skipped under ``on_error="skip"``: the step it was in, its id, and the
    first line of the error its read or ``record_transform`` raised."""

    step: int
    example: int
    error: str


def budget_text(max_skipped: int | float) -> str:
    """``max_skipped`` in words."""
    if isinstance(max_skipped, float):
        return f"{max_skipped:g} of the examples read (at least {GRACE})"
    return f"{max_skipped} examples"


class SkipLog:
    """This process's skipped examples, in the steps handed out, within a budget."""

    def __init__(self, max_skipped: int | float) -> None:
        self.max_skipped = max_skipped
        self.entries: list[Skipped] = []
        self.before = 0  # skipped before the restored step (from the state)
        self.read = 0  # examples read since the start or the restore

    @property
    def count(self) -> int:
        """Examples skipped since step 0 of the run, as this process knows it."""
        return self.before + len(self.entries)

    def restart(self, before: int) -> None:
        """Starts over at a restored or reset position, ``before`` skipped until then."""
        self.entries = []
        self.before = before
        self.read = 0

    def add(self, step: int, read: int, skipped: Sequence[Skip]) -> None:
        """Counts a step handed out; raises once the budget is exceeded."""
        self.read += read
        if not skipped:
            return
        self.entries += [Skipped(step, example, error) for example, error in skipped]
        limit = self.max_skipped
        if isinstance(limit, float):
            limit = max(GRACE, int(limit * self.read))
        if len(self.entries) > limit:
            first = "; ".join(
                f"example {s.example} at step {s.step} ({s.error})" for s in self.entries[:_SHOWN]
            )
            raise RuntimeError(
                f"on_error='skip' skipped {len(self.entries)} of the {self.read} examples "
                f"this process read, more than max_skipped={self.max_skipped!r} allows "
                f"({budget_text(self.max_skipped)}). The first: {first}. Fix the data or the "
                "record_transform, or raise max_skipped."
            )
