"""The host side of one step: the rows this process reads, ready to be placed.

``StepReader.read(step)`` is everything a step needs before JAX: the schedule's ids for
each row set the strategy reads, the source's values of those ids (``SourceRows``:
zeros for padding, a device's slice of each row where it reads only that), record
transforms, the batch ``transform``, a check of the first batch's output, and the
``mask`` field with ``last_batch="pad"``. It is numpy work only, so the pipeline can
run it on a background thread; placing the rows on devices is the strategy's. With
record workers ``read`` hands the rows to them and returns a ``PendingStep`` at once;
``finish`` (on the consumer's thread, when the step is placed) collects them and does
the rest, so no reader thread sits waiting on the workers. A finished step is a
``HostStep``: its rows, and the examples read and skipped (``on_error="skip"``), which
the loader counts when it hands the step out.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from typing import NamedTuple

import numpy as np

from meshfeed.core._held import HostBuffers
from meshfeed.core._mesh import check_sharding
from meshfeed.core._tally import Tally
from meshfeed.data._bad_records import Skip
from meshfeed.data._ragged import Ragged
from meshfeed.feed._options import LoaderOptions, Transform
from meshfeed.feed._schedule import MASK
from meshfeed.feed._shardings import FieldShardings, SequenceCut, ShardingArg
from meshfeed.feed._source_rows import SourceRows
from meshfeed.workers._pending import Pending, Rows
from meshfeed.workers._records import RecordStage

BIG_ROW = 16 << 10
"""Rows this large (all fields) are read into reused host buffers without record workers:
a copy saved pays for lending the buffer (~20 us a step); for rows of a few hundred
bytes it did not (the steps ran at 0.5-0.8x)."""


def _row_bytes(rows: SourceRows) -> int:
    return sum(math.prod(s.shape) * np.dtype(s.dtype).itemsize for s in rows.fields.values())


class Lane(NamedTuple):
    """What the steps of one batch size need: where the fields go, the batch rows the
    strategy reads on this process (one array per set), and the layout they load in;
    where each row set reads only a slice of each row (``per_device``), that ``cut``
    and each set's slice (``at``: ``None`` reads whole rows)."""

    size: int
    target: FieldShardings
    row_sets: list[np.ndarray]
    load_sharding: ShardingArg
    cut: SequenceCut | None = None
    at: list[slice | None] | None = None


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
        self._source_rows = source_rows
        self._lane = lane
        self._transform = transform
        self._records = records
        self._mask = mask
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
        at = lane.at or [None] * len(lane.row_sets)
        parts: list[Rows | Pending] = [
            read(step, rows) if a is None else self._source_rows.read(step, rows, a)
            for rows, a in zip(lane.row_sets, at, strict=True)
        ]
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
            self._check_output(data, len(ids), lane)
            self._checked.add(lane.size)
        if self._mask:
            data = {**data, MASK: ids >= 0}
        return data

    def _check_output(self, data: object, rows: int, lane: Lane) -> None:
        target = lane.target
        whole = {} if lane.cut is None else lane.cut.shapes  # fields perhaps read cut
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
                shape=whole.get(name, array.shape[1:]),
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
