"""What a record transform does to a batch's rows, wherever it runs.

``fn(record, rng) -> record`` runs once per example a process loads (decode, augment),
with the example's own generator (``_record_rng``: keyed by seed, epoch and example id),
so the output depends on nothing but the example, the seed and the epoch.
``transform_rows`` runs ``fn`` over rows into output arrays, in the loading thread, a
worker thread or a worker process alike -- a chunk at once for a transform with a batch
form (``BatchedRecordFn``), one record at a time where that raises, to name the record
at fault (``_record_errors``). This module imports no JAX, so worker processes start
fast.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from meshfeed.data._bad_records import error_line
from meshfeed.data._sources import FieldSpec
from meshfeed.workers._record_errors import Failure, RecordFailed
from meshfeed.workers._record_rng import RecordRng, record_rng, thread_rng

RecordFn = Callable[[dict[str, Any], np.random.Generator], dict[str, Any]]
"""``fn(record, rng) -> record``: one example's fields in, its new fields out; ``rng``
seeded from ``(seed, epoch, example id)``."""


def _record(batch: Mapping[str, np.ndarray], i: int) -> dict[str, Any]:
    return {k: v[i] for k, v in batch.items()}


def _check(
    out: Any, spec: Mapping[str, FieldSpec] | None, example_id: int
) -> dict[str, np.ndarray]:
    if not isinstance(out, Mapping):
        raise TypeError(
            f"record_transform returned {type(out).__name__} for example {example_id}; "
            "return a dict of field -> array."
        )
    arrays = {k: np.asarray(v) for k, v in out.items()}
    if spec is not None:
        got = {k: FieldSpec(a.shape, a.dtype) for k, a in arrays.items()}
        if got != dict(spec):
            raise ValueError(
                f"record_transform returned {got} for example {example_id}, but {dict(spec)} "
                "for the first example; every record must come out with the same fields, "
                "shapes and dtypes (pad or crop to a fixed size)."
            )
    return arrays


def transform_rows(
    fn: RecordFn,
    batch: Mapping[str, np.ndarray],
    ids: np.ndarray,
    outputs: Mapping[str, np.ndarray],
    start: int,
    seed: int,
    epoch: int,
    current: Any = None,
    skipped: list[tuple[int, int, str]] | None = None,
    filtered: list[tuple[int, int]] | None = None,
) -> None:
    """Transforms the rows of ``batch`` into ``outputs[start:]`` (padding, id < 0, is
    left as it is). An error is a ``RecordFailed`` naming the failing example, the
    transform's error its cause; ``current[0]``, if given (an int64 array or memoryview),
    holds the id of the example being transformed (a worker's parent reads it there if
    the worker dies). With ``skipped`` (``on_error="skip"``), a record that raises gets
    zero rows instead and ``(its row in outputs, its id, the error's line)`` is appended
    there. A record ``fn`` returns ``None`` for is dropped: zero rows, and ``(its row, its
    id)`` appended to ``filtered``.

    A ``BatchedRecordFn`` does the chunk at once; where that raises, the records are run
    one at a time (``fn(record, rng)``, the same result by its promise), so the one that
    raises alone is named, or skipped -- the same records whatever the chunks -- and an
    error no record raises alone is the chunk's (``Failure.chunk``)."""
    rng = thread_rng()
    rng.keyed(seed, epoch, ids)
    spec = {k: FieldSpec(v.shape[1:], v.dtype) for k, v in outputs.items()}
    if not isinstance(fn, BatchedRecordFn):
        _transform_each(fn, batch, ids, outputs, start, rng, spec, current, skipped, filtered)
        return
    chunk_error = _transform_batch(fn, batch, ids, outputs, start, rng, spec, current, filtered)
    if chunk_error is None:
        return
    found: list[tuple[int, int, str]] | None = None if skipped is None else []
    _transform_each(fn, batch, ids, outputs, start, rng, spec, current, found, filtered)
    if skipped is not None and found:  # the records at fault, skipped (one extend:
        skipped.extend(found)  # other threads' chunks append to the same list)
        return
    live = tuple(int(i) for i in ids.tolist() if i >= 0)  # none raised alone: the chunk's
    raise RecordFailed(Failure(live, error_line(chunk_error), chunk=True)) from chunk_error


def _transform_each(
    fn: RecordFn,
    batch: Mapping[str, np.ndarray],
    ids: np.ndarray,
    outputs: Mapping[str, np.ndarray],
    start: int,
    rng: RecordRng,
    spec: dict[str, FieldSpec],
    current: Any,
    skipped: list[tuple[int, int, str]] | None,
    filtered: list[tuple[int, int]] | None,
) -> None:
    """``transform_rows`` one record at a time."""
    fields = [(name, outputs[name], s.shape, s.dtype) for name, s in spec.items()]
    columns = list(batch.items())
    generator = rng.at
    for i, example_id in enumerate(ids.tolist()):
        if example_id < 0:
            continue
        if current is not None:
            current[0] = example_id
        try:
            record = {name: column[i] for name, column in columns}
            out = fn(record, generator(i))
            if out is None:  # dropped on the fly: a zero row, which the mask will hide
                for field in fields:
                    field[1][start + i] = 0
                if filtered is not None:
                    filtered.append((start + i, int(example_id)))
                continue
            try:  # the common case, checked without building anything
                if len(out) != len(fields):
                    raise KeyError
                for name, rows, shape, dtype in fields:
                    value = out[name]
                    if value.shape != shape or (value.dtype is not dtype and value.dtype != dtype):
                        raise KeyError
                    rows[start + i] = value
            except (KeyError, AttributeError, TypeError):
                checked = _check(out, spec, int(example_id))  # raises with the full story
                for name, value in checked.items():
                    outputs[name][start + i] = value
        except Exception as error:
            if skipped is not None:  # a bad record: a zero row, which the mask will hide
                for field in fields:
                    field[1][start + i] = 0
                skipped.append((start + i, int(example_id), error_line(error)))
                continue
            raise RecordFailed(Failure((int(example_id),), error_line(error))) from error


@runtime_checkable
class BatchedRecordFn(Protocol):
    """A record transform that also does a chunk of records at once (a decoder that works
    on a batch): ``prepare(record, rng)`` for each record, in order, with its own
    generator (its draws), then ``batch(records, prepared)`` for all of them. It still
    takes one record (``fn(record, rng)``: the probe, and the records of a chunk whose
    batch raised, run alone to find the one at fault), with the same result."""

    def __call__(self, record: dict[str, Any], rng: np.random.Generator) -> Any: ...

    def prepare(self, record: dict[str, Any], rng: np.random.Generator) -> Any: ...

    def batch(self, records: list[dict[str, Any]], prepared: list[Any]) -> list[Any]: ...


def _transform_batch(
    fn: BatchedRecordFn,
    batch: Mapping[str, np.ndarray],
    ids: np.ndarray,
    outputs: Mapping[str, np.ndarray],
    start: int,
    rng: RecordRng,
    spec: dict[str, FieldSpec],
    current: Any,
    filtered: list[tuple[int, int]] | None,
) -> Exception | None:
    """``transform_rows`` for a ``BatchedRecordFn``: every record prepared with its
    generator, then the chunk at once. ``None`` when done; else the chunk's error, and
    nothing written."""
    live = [i for i, example_id in enumerate(ids.tolist()) if example_id >= 0]
    columns = list(batch.items())
    records = [{name: column[i] for name, column in columns} for i in live]
    try:
        prepared = []
        for k, i in enumerate(live):
            if current is not None:
                current[0] = ids[i]
            prepared.append(fn.prepare(records[k], rng.at(i)))
        outs = fn.batch(records, prepared) if records else []
        checked = [
            None if out is None else _check(out, spec, int(ids[i]))
            for i, out in zip(live, outs, strict=True)
        ]
    except Exception as error:
        return error
    for i, arrays in zip(live, checked, strict=True):
        if arrays is None:  # dropped on the fly: a zero row, which the mask will hide
            for rows in outputs.values():
                rows[start + i] = 0
            if filtered is not None:
                filtered.append((start + i, int(ids[i])))
            continue
        for name, value in arrays.items():
            outputs[name][start + i] = value
    return None


def probe_spec(
    fn: RecordFn,
    batch: Mapping[str, np.ndarray],
    ids: np.ndarray,
    seed: int,
    epoch: int,
    *,
    skip: bool = False,
) -> dict[str, FieldSpec] | None:
    """The output fields of ``fn``, from its result on the first real row of ``batch``
    (with ``skip``, the first real row it does not raise on); ``None`` when ``fn``
    dropped every one of them (returned ``None``). ``fn`` gets a copy of the row, which
    it may write to: the row is transformed again, as read."""
    first: Exception | None = None
    dropped = False
    for i, example_id in enumerate(ids.tolist()):
        if example_id < 0:
            continue
        try:
            record = {
                k: v.copy() if isinstance(v, np.ndarray) else v
                for k, v in _record(batch, i).items()
            }
            got = fn(record, record_rng(seed, epoch, example_id))  # a copy: the row is read again
            if got is None:  # dropped: nothing to learn from
                dropped = True
                continue
            out = _check(got, None, example_id)
        except Exception as error:
            if not skip:
                raise RecordFailed(Failure((example_id,), error_line(error))) from error
            first = first or error
            continue
        return {k: FieldSpec(tuple(a.shape), a.dtype) for k, a in out.items()}
    if dropped:
        return None
    if first is not None:
        raise RuntimeError(
            f"record_transform raised on every one of the {int((ids >= 0).sum())} examples "
            f"of the first rows it was given (the first: {error_line(first)}), so "
            "on_error='skip' has no record to learn the output fields from; fix the "
            "record_transform or the data."
        ) from first
    raise ValueError("probe_spec needs at least one real row.")


Dropped = list[tuple[int, int, str | None]]
"""What the record stage dropped from some rows: ``(row, example id, error line)`` for
each record skipped (``on_error="skip"``), the line ``None`` for each one the record
transform returned ``None`` for (filtered)."""


def dropped(skipped: list[tuple[int, int, str]] | None, filtered: list[tuple[int, int]]) -> Dropped:
    """Skipped and filtered records as one ``Dropped`` list, by row."""
    return sorted([*(skipped or []), *((row, i, None) for row, i in filtered)], key=lambda d: d[0])


def chunks(rows: int, count: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` of ``count`` near-equal, non-empty chunks of ``rows`` rows."""
    count = min(rows, count)
    bounds = [rows * k // count for k in range(count + 1)] if count else [0]
    return [(lo, hi) for lo, hi in itertools.pairwise(bounds) if hi > lo]


def probe_source(
    fn: RecordFn, source: Any, seed: int, epoch: int, skip: bool = False
) -> dict[str, FieldSpec]:
    """The output fields of ``fn``, learnt from the source's first example it keeps (read
    from the start, 256 at a time; with ``skip``, reads that fail are passed over)."""
    n = len(source)
    for lo in range(0, n, 256):
        ids = np.arange(lo, min(n, lo + 256))
        try:
            data = source[ids]
        except Exception:
            if skip:
                continue  # bad records: the next ones
            raise
        spec = probe_spec(fn, data, ids, seed, epoch, skip=skip)
        if spec is not None:
            return spec
    raise ValueError(
        f"record_transform returned None for every one of the source's {n} examples "
        "(None drops an example), so no batch has a row to show; keep some."
    )
