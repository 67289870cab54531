"""The source's values of some rows of a step: ``SourceRows``.

The one place the loader asks the source for data. A read takes a set of rows of a
step's batch and gives their values, zeros for padding rows (id -1) with no read for
them, and counts what it read (``loader.stats()``'s ``source``: calls, records, bytes,
seconds). With ``on_error="skip"`` a read that fails on a bad record is read again by
halves, and the examples that fail alone become padding. With ``at`` (``per_device``
on a context axis) a ``PartialRows`` source reads each row's sequence fields cut to
those positions only, so the bytes counted are the device's slice of the rows.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from meshfeed.core._tally import Tally
from meshfeed.data._bad_records import Skip, find_bad, skippable
from meshfeed.data._ragged import Ragged, empty
from meshfeed.data._sources import FieldSpec, PartialRows, Source, thread_safe
from meshfeed.feed._schedule import RampSchedule, Schedule
from meshfeed.workers._pending import Rows


class SourceRows:
    """The source's values of some rows of a step's batch (zeros for padding).

    With ``skip`` (``on_error="skip"``), a read that fails on a bad record (anything but
    an ``OSError``: ``_bad_records``) is read again by halves to find the examples that
    fail on their own; they become padding rows (id -1), listed in ``Rows.skipped``.
    """

    def __init__(
        self,
        source: Source,
        fields: Mapping[str, FieldSpec],
        schedule: Schedule | RampSchedule,
        *,
        skip: bool = False,
    ) -> None:
        self._source = source
        self._fields = fields
        self._schedule = schedule
        self._one_at_a_time = None if thread_safe(source) else threading.Lock()
        self._skip = skip
        self.tally = Tally("reads", "records", "bytes", "seconds", "skipped")
        """What this process read from the source (``loader.stats()``)."""

    @property
    def source(self) -> Source:
        return self._source

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        """The source's fields."""
        return self._fields

    def epochs(self, step: int, rows: np.ndarray) -> np.ndarray:
        """The epoch of each of these batch rows of ``step``."""
        return self._schedule.epochs(step)[rows]

    def ids(self, step: int, rows: np.ndarray) -> np.ndarray:
        """The example ids of batch rows ``rows`` of ``step`` (-1: padding)."""
        batch_ids = self._schedule.ids(step)
        return batch_ids if len(rows) == len(batch_ids) else batch_ids[rows]

    def read(self, step: int, rows: np.ndarray, at: slice | None = None) -> Rows:
        """The values of batch rows ``rows`` of ``step``, their example ids, and the
        examples skipped; with ``at``, the sequence fields cut to those positions of
        each row (a ``PartialRows`` source's ``read_at``)."""
        if self._one_at_a_time is None:
            return self._read(step, rows, at)
        with self._one_at_a_time:
            return self._read(step, rows, at)

    def can_read_into(self) -> bool:
        """Whether ``read_into`` may work: a source with ``read_into`` and only fixed-size
        numeric fields."""
        return callable(getattr(self._source, "read_into", None)) and all(
            not spec.ragged and not np.dtype(spec.dtype).hasobject for spec in self._fields.values()
        )

    def read_into(self, step: int, rows: np.ndarray, out: Mapping[str, np.ndarray]) -> Rows | None:
        """Rows ``rows`` of ``step`` read straight into ``out`` (one array per field),
        when every row is an example (no padding) and the read succeeds; else ``None``
        (nothing counted), and ``read`` is the way."""
        began = time.perf_counter()
        ids = self.ids(step, rows)
        if not (ids >= 0).all():
            return None
        try:
            if self._one_at_a_time is None:
                self._source.read_into(ids, out)  # type: ignore[attr-defined]
            else:
                with self._one_at_a_time:
                    self._source.read_into(ids, out)  # type: ignore[attr-defined]
        except Exception:  # read again by ``read``: it raises, or skips, as it should
            return None
        return self._counted(Rows(dict(out), ids, []), len(ids), began)

    def read_elsewhere(self, step: int, rows: np.ndarray) -> np.ndarray | None:
        """The example ids of rows ``rows`` of ``step``, counted as read (the record
        workers read them out of the source's copy in shared memory), when every row is
        an example; else ``None`` (nothing counted), and ``read`` is the way."""
        began = time.perf_counter()
        ids = self.ids(step, rows)
        if not (ids >= 0).all():
            return None
        nbytes = len(ids) * sum(
            math.prod(spec.shape) * np.dtype(spec.dtype).itemsize for spec in self._fields.values()
        )
        self.tally.add(1, len(ids), nbytes, time.perf_counter() - began, 0)
        return ids

    def _counted(self, read: Rows, records: int, began: float) -> Rows:
        nbytes = 0
        for values in read.data.values():
            nbytes += getattr(values, "nbytes", 0)
        seconds = time.perf_counter() - began  # reads, records, bytes, seconds, skipped:
        self.tally.add(1, records, nbytes, seconds, len(read.skipped))
        return read

    def _reading(self, at: slice | None) -> tuple[Callable[[np.ndarray], Any], dict]:
        """How rows are read (whole, or cut to ``at``), and the fields' shapes so read."""
        if at is None:
            return self._source.__getitem__, dict(self._fields)
        source = self._source
        assert isinstance(source, PartialRows)
        positions = np.arange(at.start, at.stop)
        cut = set(source.sequence_fields)
        fields = {
            name: FieldSpec((len(positions), *spec.shape[1:]), spec.dtype) if name in cut else spec
            for name, spec in self._fields.items()
        }
        return lambda ids: source.read_at(ids, positions), fields

    def _read(self, step: int, rows: np.ndarray, at: slice | None) -> Rows:
        began = time.perf_counter()
        ids = self.ids(step, rows)
        valid = ids >= 0
        skipped: list[Skip] = []
        read, fields = self._reading(at)
        try:  # no read at all for rows that are all padding
            real: Mapping[str, Any] = (
                read(ids) if valid.all() else read(ids[valid]) if valid.any() else {}
            )
        except Exception as error:
            if not (self._skip and skippable(error)):
                raise
            bad = find_bad(read, ids[valid], error)
            where = np.flatnonzero(valid)[[i for i, _ in bad]]
            skipped = [(int(ids[a]), line) for a, (_, line) in zip(where, bad, strict=True)]
            ids = ids.copy()
            ids[where] = -1
            valid = ids >= 0
            real = read(ids[valid]) if valid.any() else {}
        if valid.all():
            return self._counted(Rows(dict(real), ids, skipped), len(ids), began)
        data: dict[str, Any] = {}
        for name, spec in fields.items():
            if spec.ragged:  # padding rows are empty documents
                data[name] = (
                    Ragged.expand(valid, real[name])
                    if real
                    else empty(len(ids), spec.dtype, spec.shape[1:])
                )  # type: ignore[arg-type]
            else:
                data[name] = np.zeros((len(ids), *spec.shape), spec.dtype)
                if real:
                    data[name][valid] = real[name]
        return self._counted(Rows(data, ids, skipped), int(np.count_nonzero(valid)), began)
