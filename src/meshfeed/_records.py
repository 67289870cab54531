"""Per-record transforms, in order, in the loading thread or in worker processes.

``fn(record, rng) -> record`` runs once per example a process loads (decode, augment).
Its random generator is a PCG64 seeded from a hash of ``(seed, epoch, example_id)``, so
the output depends on nothing but the example, the seed and the epoch: not on the number
of workers, nor on the number of processes. (It is re-seeded in place for speed: use it
within the call.)

With ``num_workers=0`` the records are transformed in the loading thread. With ``W > 0``
a batch's rows are cut into chunks that a ``WorkerPool`` (``_workers``) transforms in
parallel into shared memory (``_shm``), and the record stage keeps the next steps'
batches queued so the workers never wait for it. The output fields are learnt from the
first real example; every later record must match them.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from meshfeed._schedule import hash64
from meshfeed._sources import FieldSpec
from meshfeed._workers import EXAMPLE_ID, Ticket, WorkerPool

RecordFn = Callable[[dict[str, Any], np.random.Generator], dict[str, Any]]
_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # SplitMix64's increment


def _splitmix64(z: int) -> int:
    return hash64((z + _GOLDEN) & _M64)


class RecordRng:
    """Per-example generators without a SeedSequence per example.

    ``for_example(seed, epoch, id)`` re-seeds one PCG64 from a SplitMix64 hash of the
    three numbers (about 2 us, a new ``default_rng`` costs 8 us, a PNG decode 25) and
    returns its ``Generator``, which is therefore valid until the next call: a record
    transform must use it within its call, not keep it.
    """

    def __init__(self) -> None:
        self._bits = np.random.PCG64(0)
        self._generator = np.random.Generator(self._bits)

    def for_example(self, seed: int, epoch: int, example_id: int) -> np.random.Generator:
        a = _splitmix64(_splitmix64(_splitmix64(seed) ^ epoch) ^ (int(example_id) & _M64))
        b = _splitmix64(a)
        self._bits.state = {
            "bit_generator": "PCG64",
            "state": {"state": (a << 64) | b, "inc": ((b << 1) | 1) & ((1 << 128) - 1)},
            "has_uint32": 0,
            "uinteger": 0,
        }
        return self._generator


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
) -> None:
    """Transforms the rows of ``batch`` into ``outputs[start:]`` (padding, id < 0, is
    left as it is). An exception carries the failing example's id as ``EXAMPLE_ID``."""
    rng = RecordRng()
    spec = {k: FieldSpec(v.shape[1:], v.dtype) for k, v in outputs.items()}
    fields = list(spec.items())
    for i, example_id in enumerate(ids):
        if example_id < 0:
            continue
        try:
            out = fn(_record(batch, i), rng.for_example(seed, epoch, example_id))
            try:  # the common case, checked without building anything
                if len(out) != len(fields):
                    raise KeyError
                for name, s in fields:
                    value = out[name]
                    if value.shape != s.shape or value.dtype != s.dtype:
                        raise KeyError
                    outputs[name][start + i] = value
            except (KeyError, AttributeError, TypeError):
                checked = _check(out, spec, int(example_id))  # raises with the full story
                for name, value in checked.items():
                    outputs[name][start + i] = value
        except Exception as error:
            with contextlib.suppress(AttributeError):  # a worker reports the example
                setattr(error, EXAMPLE_ID, int(example_id))
            raise


def probe_spec(
    fn: RecordFn, batch: Mapping[str, np.ndarray], ids: np.ndarray, seed: int, epoch: int
) -> dict[str, FieldSpec]:
    """The output fields of ``fn``, from its result on the first real row of ``batch``."""
    for i, example_id in enumerate(ids):
        if example_id >= 0:
            out = _check(
                fn(_record(batch, i), record_rng(seed, epoch, example_id)), None, example_id
            )
            return {k: FieldSpec(tuple(a.shape), a.dtype) for k, a in out.items()}
    raise ValueError("probe_spec needs at least one real row.")


class StepRows(Protocol):
    """What the record stage reads from: the source's rows of a step, and its epoch."""

    def read(self, step: int, rows: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The source's values of these batch rows (zeros for padding), and their ids."""
        ...

    def epoch(self, step: int) -> int: ...


class RecordStage:
    """Record transforms for the rows of each step: in this thread, or in workers.

    With workers, the next ``ahead`` steps' rows are read and submitted while the
    current one is transformed, so the workers never wait; a request for a step that
    was not queued (after ``restore``) drops the queue.
    """

    def __init__(
        self,
        fn: RecordFn,
        *,
        num_workers: int,
        seed: int,
        source_rows: StepRows,
        end: int | None,
        ahead: int,
    ) -> None:
        self.fn, self.num_workers, self.seed = fn, num_workers, seed
        self._rows, self._end, self._ahead = source_rows, end, ahead
        self.spec: dict[str, FieldSpec] | None = None
        self._pool: WorkerPool | None = None
        self._queued: dict[tuple[int, bytes], tuple[Ticket | None, np.ndarray]] = {}
        self._lock = threading.Lock()

    def __call__(self, step: int, rows: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The transformed values of these batch rows of ``step``, and their ids."""
        with self._lock:
            if self.num_workers == 0:
                data, ids = self._rows.read(step, rows)
                return self._in_thread(data, ids, self._rows.epoch(step)), ids
            return self._from_workers(step, rows)

    def _learn(self, data: Mapping[str, np.ndarray], ids: np.ndarray, epoch: int) -> bool:
        if self.spec is None and (ids >= 0).any():
            self.spec = probe_spec(self.fn, data, ids, self.seed, epoch)
        return self.spec is not None

    def _zeros(self, rows: int) -> dict[str, np.ndarray]:
        assert self.spec is not None
        return {k: np.zeros((rows, *s.shape), s.dtype) for k, s in self.spec.items()}

    def _in_thread(
        self, data: dict[str, np.ndarray], ids: np.ndarray, epoch: int
    ) -> dict[str, np.ndarray]:
        if not self._learn(data, ids, epoch):
            return data  # only padding so far: nothing to learn the output from
        out = self._zeros(len(ids))
        transform_rows(self.fn, data, ids, out, 0, self.seed, epoch)
        return out

    def _from_workers(
        self, step: int, rows: np.ndarray
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        key = rows.tobytes()
        if (step, key) not in self._queued:
            self._drop(key)
        last = (
            step + self._ahead + 1 if self._end is None else min(step + self._ahead + 1, self._end)
        )
        for s in range(step, max(last, step + 1)):
            if (s, key) not in self._queued:
                self._queued[(s, key)] = self._submit(s, rows)
        ticket, ids = self._queued.pop((step, key))
        if ticket is None:  # all padding, before any output was seen
            data, _ = self._rows.read(step, rows)
            return (data if self.spec is None else self._zeros(len(ids))), ids
        assert self._pool is not None
        out = self._pool.collect(ticket)
        padding = ids < 0
        if padding.any():
            for array in out.values():
                array[padding] = 0
        return out, ids

    def _submit(self, step: int, rows: np.ndarray) -> tuple[Ticket | None, np.ndarray]:
        data, ids = self._rows.read(step, rows)
        epoch = self._rows.epoch(step)
        if not self._learn(data, ids, epoch):
            return None, ids
        assert self.spec is not None
        if self._pool is None:
            work = functools.partial(transform_rows, self.fn)
            self._pool = WorkerPool(work, self.num_workers)
        return self._pool.submit(data, ids, self.spec, self.seed, epoch), ids

    def _drop(self, key: bytes) -> None:
        for queued in [k for k in self._queued if k[1] == key]:
            ticket, _ = self._queued.pop(queued)
            if ticket is not None and self._pool is not None:
                self._pool.collect(ticket, keep=False)

    def close(self) -> None:
        with self._lock:
            self._queued.clear()
            if self._pool is not None:
                self._pool.close()
                self._pool = None
