"""The host side of one step: the rows this process reads, ready to be placed.

``StepReader.read(step)`` is everything a step needs before JAX: the schedule's ids for
each row set the strategy reads, the source's values of those ids (zeros for padding),
record transforms, the batch ``transform``, a check of the first batch's output, and
the ``mask`` field with ``last_batch="pad"``. It is numpy work only, so the pipeline
can run it on a background thread; placing the rows on devices is the strategy's.
With record workers ``read`` hands the rows to them and returns a ``PendingStep`` at
once; ``finish`` (on the consumer's thread, when the step is placed) collects them and
does the rest, so no reader thread sits waiting on the workers. A finished step is a
``HostStep``: its rows, and the examples read and skipped (``on_error="skip"``), which
the loader counts when it hands the step out.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from meshfeed.core._held import HostBuffers
from meshfeed.core._mesh import check_sharding
from meshfeed.core._tally import Tally
from meshfeed.data._bad_records import Skip, find_bad, skippable
from meshfeed.data._ragged import Ragged, empty
from meshfeed.data._sources import FieldSpec, Source, thread_safe
from meshfeed.feed._options import LoaderOptions, Transform
from meshfeed.feed._schedule import MASK, RampSchedule, Schedule
from meshfeed.feed._shardings import FieldShardings, ShardingArg
from meshfeed.workers._records import Pending, RecordStage, Rows

BIG_ROW = 16 << 10
"""Rows this large (all fields) are read into reused host buffers without record workers:
a copy saved pays for lending the buffer (~20 us a step); for rows of a few hundred
bytes it did not (the steps ran at 0.5-0.8x)."""


def _row_bytes(rows: SourceRows) -> int:
    return sum(math.prod(s.shape) * np.dtype(s.dtype).itemsize for s in rows.fields.values())


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
        self._source, self._fields, self._schedule = source, fields, schedule
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

    def read(self, step: int, rows: np.ndarray) -> Rows:
        """The values of batch rows ``rows`` of ``step``, their example ids, and the
        examples skipped."""
        if self._one_at_a_time is None:
            return self._read(step, rows)
        with self._one_at_a_time:
            return self._read(step, rows)

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

    def _counted(self, read: Rows, records: int, began: float) -> Rows:
        nbytes = 0
        for values in read.data.values():
            nbytes += getattr(values, "nbytes", 0)
        seconds = time.perf_counter() - began  # reads, records, bytes, seconds, skipped:
        self.tally.add(1, records, nbytes, seconds, len(read.skipped))
        return read

    def _read(self, step: int, rows: np.ndarray) -> Rows:
        began = time.perf_counter()
        ids = self.ids(step, rows)
        valid = ids >= 0
        skipped: list[Skip] = []
        try:  # no read at all for rows that are all padding
            real: Mapping[str, Any] = (
                self._source[ids]
                if valid.all()
                else self._source[ids[valid]]
                if valid.any()
                else {}
            )
        except Exception as error:
            if not (self._skip and skippable(error)):
                raise
            bad = find_bad(self._source.__getitem__, ids[valid], error)
            at = np.flatnonzero(valid)[[i for i, _ in bad]]
            skipped = [(int(ids[a]), line) for a, (_, line) in zip(at, bad, strict=True)]
            ids = ids.copy()
            ids[at] = -1
            valid = ids >= 0
            real = self._source[ids[valid]] if valid.any() else {}
        if valid.all():
            return self._counted(Rows(dict(real), ids, skipped), len(ids), began)
        data: dict[str, Any] = {}
        for name, spec in self._fields.items():
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


class Lane(NamedTuple):
    """What the steps of one batch size need: where the fields go, the batch rows the
    strategy reads on this process (one array per set), and the layout they load in."""

    size: int
    target: FieldShardings
    row_sets: list[np.ndarray]
    load_sharding: ShardingArg


@dataclasses.dataclass
class HostStep:
    """A step's host rows, one dict per row set, with the examples this process read
    for it (padding aside, skipped and filtered ones included), those it skipped, and
    how many the record transform dropped."""

    rows: list[dict[str, np.ndarray]]
    read: int
    skipped: list[Skip]
    filtered: int = 0  # examples the record transform dropped (returned None for)
    collect_seconds: float = 0.0  # waiting for the record workers' rows (``loader.stats()``)
    place_seconds: float = 0.0  # placing the rows on the devices

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for rows in self.rows for a in rows.values())


@dataclasses.dataclass
class PendingStep:
    """A step whose rows are in the record workers' hands (``StepReader.finish``)."""

    lane: Lane
    parts: list[Rows | Pending]

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts if isinstance(p, Pending))

    def release(self) -> None:
        """Drops the rows, never to be collected (no module globals: this may run as
        the interpreter shuts down)."""
        for part in self.parts:
            release = getattr(part, "release", None)
            if release is not None:
                release()


class StepReader:
    """This process's host rows of a step: one dict of numpy arrays per row set.

    Args:
      source_rows: where the values come from.
      lane: the ``Lane`` of a step (of its batch size).
      transform: the batch transform, or ``None``.
      records: the record stage, or ``None``.
      mask: add the ``mask`` field (``last_batch="pad"``, ``on_error="skip"``).
    """

    def __init__(
        self,
        source_rows: SourceRows,
        lane: Callable[[int], Lane],
        *,
        transform: Transform | None,
        records: RecordStage | None,
        mask: bool,
    ) -> None:
        self._source_rows, self._lane = source_rows, lane
        self._transform, self._records, self._mask = transform, records, mask
        self._checked: set[int] = set()  # the batch sizes whose output has been checked
        self.tally = Tally("calls", "seconds")
        """The batch ``transform``'s calls and seconds (``loader.stats()``)."""
        into = (
            records is None and source_rows.can_read_into() and _row_bytes(source_rows) >= BIG_ROW
        )
        self._buffers = HostBuffers() if into else None  # what the source reads into

    def read(self, step: int) -> HostStep | PendingStep:
        """The host rows of ``step``, or with record workers a ``PendingStep``."""
        lane = self._lane(step)
        read = self._source_rows.read if self._buffers is None else self._read_into
        if self._records is not None:
            read = self._records
        parts: list[Rows | Pending] = [read(step, rows) for rows in lane.row_sets]
        if any(isinstance(p, Pending) for p in parts):
            return PendingStep(lane, parts)
        return self._finish(parts, lane)  # type: ignore[arg-type]

    def _read_into(self, step: int, rows: np.ndarray) -> Rows:
        """The source's rows read straight into reused, aligned host memory
        (``HostBuffers``): one copy, where a gather and then JAX's own copy of a
        misaligned array were two; on CPU devices XLA uses it in place, elsewhere the
        transfer reads warm memory. ``read`` where the source cannot (padding, a failure)."""
        assert self._buffers is not None
        out = self._buffers.take(self._source_rows.fields, len(rows))
        got = self._source_rows.read_into(step, rows, out)
        return got if got is not None else self._source_rows.read(step, rows)

    def finish(self, host: HostStep | PendingStep) -> HostStep:
        """The host rows of a step ``read`` returned (waits for its record workers)."""
        if not isinstance(host, PendingStep):
            return host
        return self._finish(
            [p.result() if isinstance(p, Pending) else p for p in host.parts], host.lane
        )

    def _finish(self, parts: list[Rows], lane: Lane) -> HostStep:
        skipped = [s for part in parts for s in part.skipped]
        filtered = sum(part.filtered for part in parts)
        read = sum(int((part.ids >= 0).sum()) for part in parts) + len(skipped) + filtered
        rows = [self._finish_rows(p, lane) for p in parts]
        return HostStep(rows, read, skipped, filtered=filtered)

    def _finish_rows(self, rows: Rows, lane: Lane) -> dict[str, np.ndarray]:
        data, ids = rows.data, rows.ids
        if self._transform is not None:
            began = time.perf_counter()
            data = self._transform(data)
            self.tally.add(1, time.perf_counter() - began)  # calls, seconds
        if lane.size not in self._checked:
            self._check_output(data, len(ids), lane.target)
            self._checked.add(lane.size)
        if self._mask:
            data = {**data, MASK: ids >= 0}
        return data

    def _check_output(self, data: object, rows: int, target: FieldShardings) -> None:
        who = "transform" if self._transform is not None else "source"
        if not isinstance(data, Mapping) or not data:
            raise TypeError(
                f"the {who} returned {type(data).__name__}; it must return a non-empty "
                "dict of field name -> numpy array."
            )
        for name, array in data.items():
            if isinstance(array, Ragged):
                raise ValueError(
                    f"field {name!r} holds variable-length documents (Ragged) and cannot go "
                    "to devices as they are; pack them into fixed rows with "
                    "meshfeed.pack(source, seq_len), or pad them with record_transform= "
                    "(per example) or transform= (per batch)."
                )
            if not isinstance(array, np.ndarray) or array.ndim == 0 or len(array) != rows:
                got = getattr(array, "shape", type(array).__name__)
                raise ValueError(
                    f"the {who} returned field {name!r} as {got} for {rows} rows; return "
                    f"one numpy row per example ({rows} rows)."
                )
            if array.dtype.hasobject:
                raise ValueError(
                    f"field {name!r} holds variable-length values (an object array) and "
                    "cannot go to devices; decode or pad it to a fixed shape with "
                    "record_transform= (per example) or transform= (per batch)."
                )
            if self._mask and name == MASK:
                raise ValueError(
                    f"the {who} returned a field named {MASK!r}, which last_batch='pad', "
                    "on_error='skip' and a record_transform add themselves; rename that field."
                )
            check_sharding(
                target.of(name, array.ndim),
                name=name,
                global_batch_size=target.global_batch_size,
                shape=array.shape[1:],
            )

    @property
    def has_transform(self) -> bool:
        """Whether there is a batch ``transform``."""
        return self._transform is not None

    @property
    def records(self) -> RecordStage | None:
        """The record stage, if there is a ``record_transform``."""
        return self._records

    def steps_ahead(self) -> int | None:
        """The most steps the read-ahead may hold for the record workers' shared memory
        (``None``: no bound but its own)."""
        return None if self._records is None else self._records.steps_ahead()

    def close(self) -> None:
        """Stops record workers and frees their shared memory."""
        if self._records is not None:
            self._records.close()


def make_reader(
    source_rows: SourceRows,
    options: LoaderOptions,
    lane: Callable[[int], Lane],
    *,
    max_depth: int,
) -> StepReader:
    """The reader of a loader's ``options``: its record stage, transform and mask
    (``max_depth``: the most steps the read-ahead holds with ``prefetch="auto"``)."""
    records = None
    skip = options.on_error == "skip"
    if options.record_transform is not None:
        steps = max_depth if options.prefetch == "auto" else int(options.prefetch)
        records = RecordStage(
            options.record_transform,
            num_workers=options.num_workers,
            worker_type=options.worker_type,
            seed=options.seed,
            source_rows=source_rows,
            read_ahead=(steps, options.prefetch_bytes),
            skip=skip,
        )
    return StepReader(
        source_rows,
        lane,
        transform=options.transform,
        records=records,
        mask=options.last_batch == "pad" or skip or options.record_transform is not None,
    )
