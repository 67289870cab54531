"""A step's rows out of the record stage: ``Rows`` (values, ids, records skipped), or a
``Pending`` for rows in the workers' hands.

Handing rows to workers returns at once; whoever needs them calls ``Pending.result``,
which collects each part from its pool (``Handed``) and, for a step that straddles two
epochs (handed over in two parts, each row's generator keyed on its own epoch), puts
the parts back in row order. ``skipping`` marks the records the transform skipped or
filtered: their rows zero, their ids -1.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

import numpy as np

from meshfeed.core._tally import Tally
from meshfeed.data._bad_records import Skip
from meshfeed.workers._ray_workers import RayWorkers
from meshfeed.workers._record_rows import Dropped
from meshfeed.workers._shm import Spec


class Rows(NamedTuple):
    """Values of some batch rows, their example ids (-1: padding, an example skipped
    under ``on_error="skip"``, or one the record transform dropped), the skipped
    examples' ids and error lines, and how many examples were dropped (*filtered*)."""

    data: dict[str, Any]
    ids: np.ndarray
    skipped: list[Skip]
    filtered: int = 0


class Workers(Protocol):
    """A pool that transforms a batch's rows in chunks: ``WorkerPool`` or ``ThreadWorkers``."""

    def submit(
        self, batch: Mapping[str, np.ndarray], ids: np.ndarray, spec: Spec, seed: int, epoch: int
    ) -> Any: ...

    def collect(self, ticket: Any) -> tuple[dict[str, np.ndarray], Dropped]:
        """The rows, and the ``(row, id, error line)`` of each record skipped."""
        ...

    def release(self, ticket: Any) -> None: ...

    def close(self) -> None: ...


class Pending:
    """Rows handed to the workers: ``result()`` waits for them, ``release()`` drops them.

    A step that straddles two epochs is handed over in two parts (each row's generator
    keys on its own epoch); ``result`` puts them back in row order.
    """

    def __init__(self, rows: int, parts: list[tuple[np.ndarray | None, Any]]) -> None:
        self._rows = rows
        self._parts = parts  # (where in the rows, Rows or a Handed)

    @property
    def nbytes(self) -> int:
        """Bytes of the output rows (what the read-ahead counts against its budget)."""
        return sum(p.nbytes if isinstance(p, Handed) else 0 for _, p in self._parts)

    def result(self) -> Rows:
        """The transformed rows and their ids (waits for the workers)."""
        got = [(at, p.result() if isinstance(p, Handed) else p) for at, p in self._parts]
        if len(got) == 1:
            return got[0][1]
        out: dict[str, np.ndarray] = {}
        ids = np.empty(self._rows, np.int64)
        skipped: list[Skip] = []
        filtered = 0
        for at, (data, part_ids, part_skipped, part_filtered) in got:
            ids[at] = part_ids
            skipped += part_skipped
            filtered += part_filtered
            for name, values in data.items():
                if name not in out:
                    out[name] = np.empty((self._rows, *values.shape[1:]), values.dtype)
                out[name][at] = values
        return Rows(out, ids, skipped, filtered)

    def release(self) -> None:
        """Drops rows never to be collected (the read-ahead was closed or moved; no
        module globals: this may run as the interpreter shuts down)."""
        for _, part in self._parts:
            pool = getattr(part, "pool", None)
            if pool is not None:
                pool.release(part.ticket)


class Handed(NamedTuple):
    pool: Workers | RayWorkers
    ticket: Any
    read: Rows  # what the workers were given
    nbytes: int
    tally: Tally  # the stage's: records and skipped, counted as they come back
    records: int  # the examples handed over (padding aside)

    def result(self) -> Rows:
        out, skipped = self.pool.collect(self.ticket)
        rows = skipping(out, self.read, skipped)
        now = len(rows.skipped) - len(self.read.skipped)  # records, seconds, skipped,
        self.tally.add(self.records, 0, now, rows.filtered)  # filtered
        return rows


def skipping(out: dict[str, np.ndarray], read: Rows, gone: Dropped) -> Rows:
    """The transformed rows, the records skipped or filtered (their rows zero, their ids
    -1) on top of those the read skipped."""
    ids = read.ids
    if gone:
        ids = ids.copy()
        ids[[row for row, _, _ in gone]] = -1
    real = ids >= 0
    if not real.all():
        for array in out.values():
            array[~real] = 0
    skipped = [(i, line) for _, i, line in gone if line is not None]
    return Rows(out, ids, [*read.skipped, *skipped], len(gone) - len(skipped))
