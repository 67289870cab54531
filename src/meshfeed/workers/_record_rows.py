"""What a record transform does to a batch's rows, wherever it runs.

``fn(record, rng) -> record`` runs once per example a process loads (decode, augment).
Its random generator is a PCG64 seeded from a hash of ``(seed, epoch, example_id)``, so
the output depends on nothing but the example, the seed and the epoch: not on the number
of workers, their kind, nor the number of processes. (It is re-seeded in place for
speed: use it within the call.) ``transform_rows`` runs ``fn`` over rows into output
arrays, in the loading thread, a worker thread or a worker process alike; this module
imports no JAX, so worker processes start fast.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from meshfeed.core._permutation import M64, hash64
from meshfeed.data._bad_records import error_line
from meshfeed.data._sources import FieldSpec

EXAMPLE_ID = "meshfeed_example_id"  # set on an exception by the work that raised it
RecordFn = Callable[[dict[str, Any], np.random.Generator], dict[str, Any]]
"""``fn(record, rng) -> record``: one example's fields in, its new fields out; ``rng``
seeded from ``(seed, epoch, example id)``."""
_M128 = (1 << 128) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # SplitMix64's increment


def _splitmix64(z: Any) -> Any:
    """SplitMix64's step, on a Python int or on a ``uint64`` array (which wraps)."""
    if isinstance(z, np.ndarray):
        return hash64(z + np.uint64(_GOLDEN))
    return hash64((z + _GOLDEN) & M64)


def example_keys(seed: int, epoch: int, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The two 64-bit keys of each example's generator, for all of ``ids`` at once."""
    base = _splitmix64(_splitmix64(seed) ^ epoch)
    with np.errstate(over="ignore"):
        a = _splitmix64(np.uint64(base) ^ np.asarray(ids).astype(np.uint64))
        b = _splitmix64(a)
    return a, b


def _state_words(bits: np.random.PCG64) -> tuple[memoryview, memoryview] | None:
    """Views of ``bits``'s state in memory, if numpy lays it out as this expects.

    numpy's ``ctypes.state_address`` points at ``{pcg64_random_t *state; int
    has_uint32; uint32_t uinteger}``, and the ``pcg64_random_t`` at the 128-bit state and
    increment, low words first. The layout is checked once a process against the
    ``state`` setter (``_layout_ok``), so a numpy that lays it out differently gets
    ``None`` and the setter is used.
    """
    views = _views(bits) if _layout_ok() else None
    if views is None:
        return None
    header, words = views
    return header.data.cast("B").cast("Q"), words.data.cast("B").cast("Q")


def _views(bits: np.random.PCG64) -> tuple[np.ndarray, np.ndarray] | None:
    try:
        address = bits.ctypes.state_address
        header = np.ctypeslib.as_array((ctypes.c_uint64 * 2).from_address(address))
        words = np.ctypeslib.as_array((ctypes.c_uint64 * 4).from_address(int(header[0])))
    except (AttributeError, TypeError, ValueError):
        return None
    return header, words


@functools.cache
def _layout_ok() -> bool:
    """Whether writing the state words in place works here (checked once a process)."""
    bits = np.random.PCG64(0)
    views = _views(bits)
    return views is not None and _layout_holds(bits, *views)


def _layout_holds(bits: np.random.PCG64, header: np.ndarray, words: np.ndarray) -> bool:
    """Writing the words gives what the ``state`` setter gives: the words, the draws."""
    try:
        generator = np.random.Generator(bits)
        for a, b in ((0x0123456789ABCDEF, 0xFEDCBA9876543210), (7, 11)):
            _set_state(bits, a, b)
            generator.integers(0, 1000)  # leaves a buffered 32-bit half behind
            draws = generator.integers(0, 1 << 62, 4)
            _set_state(bits, a, b)
            if words.tolist() != _words(a, b):
                return False
            header[1] = 7  # a stale buffered half, which the fast path must clear
            words[:] = _words(a, b)
            header[1] = 0
            generator.integers(0, 1000)
            if generator.integers(0, 1 << 62, 4).tolist() != draws.tolist():
                return False
    except (TypeError, ValueError, OverflowError):
        return False
    return True


def _words(a: int, b: int) -> list[int]:
    """The four 64-bit words of the state ``(a << 64) | b`` and increment ``2b + 1``."""
    return [b, a, ((b << 1) | 1) & M64, b >> 63]


def _set_state(bits: np.random.PCG64, a: int, b: int) -> None:
    bits.state = {
        "bit_generator": "PCG64",
        "state": {"state": (a << 64) | b, "inc": ((b << 1) | 1) & _M128},
        "has_uint32": 0,
        "uinteger": 0,
    }


class RecordRng:
    """Per-example generators without a SeedSequence per example.

    ``keyed(seed, epoch, ids)`` hashes ``(seed, epoch, id)`` for a chunk of examples at
    once with SplitMix64 into each one's two 64-bit keys; ``at(i)`` re-seeds one PCG64
    (state ``(a << 64) | b``, increment ``2b + 1``) from example ``i``'s keys and returns
    its ``Generator``, which is therefore valid until the next call: a record transform
    must use it within its call, not keep it. Re-seeding writes the four words into the
    generator's state (0.4 us; the ``state`` setter takes 1.3, a new ``default_rng`` 20,
    a 32x32 PNG decode 45 on this machine), or uses the setter where numpy lays the
    state out differently.
    """

    def __init__(self) -> None:
        self._bits = np.random.PCG64(0)
        self._generator = np.random.Generator(self._bits)
        self._memory = _state_words(self._bits)
        self._states = memoryview(b"").cast("Q")
        self._keys: tuple[list[int], list[int]] = ([], [])

    def keyed(self, seed: int, epoch: int, ids: np.ndarray) -> None:
        """Keys the generators of ``ids`` (``at(i)`` is then example ``ids[i]``'s)."""
        a, b = example_keys(seed, epoch, ids)
        if self._memory is None:
            self._keys = (a.tolist(), b.tolist())
            return
        states = np.empty((len(a), 4), np.uint64)
        states[:, 0], states[:, 1] = b, a
        states[:, 2] = (b << np.uint64(1)) | np.uint64(1)
        states[:, 3] = b >> np.uint64(63)
        self._states = states.reshape(-1).data.cast("B").cast("Q")

    def at(self, i: int) -> np.random.Generator:
        """The generator of the ``i``-th id given to ``keyed``, in its first state."""
        if self._memory is None:
            _set_state(self._bits, self._keys[0][i], self._keys[1][i])
        else:
            header, words = self._memory
            words[:] = self._states[4 * i : 4 * i + 4]
            header[1] = 0  # no buffered 32-bit half
        return self._generator

    def for_example(self, seed: int, epoch: int, example_id: int) -> np.random.Generator:
        self.keyed(seed, epoch, np.asarray([example_id]))
        return self.at(0)


_per_thread = threading.local()


def _thread_rng() -> RecordRng:
    """This thread's ``RecordRng``: made once (65 us with cold caches, per chunk a
    measurable share of a worker's time), re-keyed for every chunk."""
    rng = getattr(_per_thread, "rng", None)
    if rng is None:
        rng = _per_thread.rng = RecordRng()
    return rng


def record_rng(seed: int, epoch: int, example_id: int) -> np.random.Generator:
    """A fresh generator in the state ``fn`` sees for this example."""
    return RecordRng().for_example(seed, epoch, example_id)


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
    left as it is). An exception carries the failing example's id as ``EXAMPLE_ID``;
    ``current[0]``, if given (an int64 array or memoryview), holds the id of the example
    being transformed (a worker's parent reads it there if the worker dies). With
    ``skipped`` (``on_error="skip"``), a record that raises gets zero rows instead and
    ``(its row in outputs, its id, the error's line)`` is appended there. A record ``fn``
    returns ``None`` for is dropped: zero rows, and ``(its row, its id)`` appended to
    ``filtered``."""
    rng = _thread_rng()
    spec = {k: FieldSpec(v.shape[1:], v.dtype) for k, v in outputs.items()}
    fields = [(name, outputs[name], s.shape, s.dtype) for name, s in spec.items()]
    rng.keyed(seed, epoch, ids)
    if isinstance(fn, BatchedRecordFn) and skipped is None:
        _transform_batch(fn, batch, ids, outputs, start, rng, spec, current, filtered)
        return
    columns, generator = list(batch.items()), rng.at
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
            with contextlib.suppress(AttributeError):  # a worker reports the example
                setattr(error, EXAMPLE_ID, int(example_id))
            raise


@runtime_checkable
class BatchedRecordFn(Protocol):
    """A record transform that also does a chunk of records at once (a decoder that works
    on a batch): ``prepare(record, rng)`` for each record, in order, with its own
    generator (its draws), then ``batch(records, prepared)`` for all of them. It still
    takes one record (``fn(record, rng)``: the probe, and ``on_error="skip"``, which
    judges records one by one), with the same result."""

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
) -> None:
    """``transform_rows`` for a ``BatchedRecordFn``: every record prepared with its
    generator, then the chunk at once; a failure names the record ``batch`` says
    (``record_index`` on the error), else the chunk's first."""
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
    except Exception as error:
        at = getattr(error, "record_index", None)
        k = at if isinstance(at, int) and 0 <= at < len(live) else 0
        with contextlib.suppress(AttributeError):  # a worker reports the example
            setattr(error, EXAMPLE_ID, int(ids[live[k]]) if live else -1)
        raise
    for i, out in zip(live, outs, strict=True):
        if out is None:  # dropped on the fly: a zero row, which the mask will hide
            for rows in outputs.values():
                rows[start + i] = 0
            if filtered is not None:
                filtered.append((start + i, int(ids[i])))
            continue
        for name, value in _check(out, spec, int(ids[i])).items():
            outputs[name][start + i] = value


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
    dropped every one of them (returned ``None``)."""
    first: Exception | None = None
    dropped = False
    for i, example_id in enumerate(ids.tolist()):
        if example_id < 0:
            continue
        try:
            got = fn(_record(batch, i), record_rng(seed, epoch, example_id))
            if got is None:  # dropped: nothing to learn from
                dropped = True
                continue
            out = _check(got, None, example_id)
        except Exception as error:
            if not skip:
                raise
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
