"""Per-record transforms, in order, in worker processes, with results in shared memory.

``fn(record, rng) -> record`` runs once per example a process loads (decode, augment).
Its random generator is a PCG64 seeded from a hash of ``(seed, epoch, example_id)``, so
the output depends on nothing but the example, the seed and the epoch: not on the number
of workers, nor on the number of processes. (It is re-seeded in place for speed: use it
within the call.)

With ``num_workers=0`` the records are transformed in the loading thread. With ``W > 0``
a batch's rows are cut into chunks that W worker processes (started with ``spawn``:
forking a process that runs JAX is unsafe) transform in parallel, each writing its
output rows straight into one shared-memory block that the main process created; only
the chunks' inputs travel through pipes. The main process copies the finished rows out
before reusing the block (JAX may keep referencing host memory it was handed), waits
with a timeout while watching the workers, and turns a worker's exception or death into
an error naming the example id. It owns the shared memory and unlinks it on close, on
error and at exit; if it is killed, Python's resource tracker unlinks it.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import math
import mmap
import multiprocessing as mp
import os
import queue
import threading
import traceback
import weakref
from collections.abc import Callable, Mapping
from multiprocessing import shared_memory
from typing import Any, NamedTuple

import numpy as np

RecordFn = Callable[[dict[str, Any], np.random.Generator], dict[str, Any]]
_POLL_S = 0.05


class OutSpec(NamedTuple):
    shape: tuple[int, ...]
    dtype: np.dtype


_M64 = (1 << 64) - 1


def _mix(z: int) -> int:
    """SplitMix64: one well-mixed 64-bit word from another."""
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


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
        a = _mix(_mix(_mix(seed) ^ epoch) ^ (int(example_id) & _M64))
        b = _mix(a)
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


def _check(out: Any, spec: Mapping[str, OutSpec] | None, example_id: int) -> dict[str, np.ndarray]:
    if not isinstance(out, Mapping):
        raise TypeError(
            f"record_transform returned {type(out).__name__} for example {example_id}; "
            "return a dict of field -> array."
        )
    arrays = {k: np.asarray(v) for k, v in out.items()}
    if spec is not None:
        got = {k: OutSpec(a.shape, a.dtype) for k, a in arrays.items()}
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
    spec: Mapping[str, OutSpec],
    seed: int,
    epoch: int,
    start: int = 0,
) -> None:
    """Transforms rows of ``batch`` (padding, id < 0, is left as zeros) into ``outputs``."""
    rng = RecordRng()
    fields = list(spec.items())
    for i, example_id in enumerate(ids):
        if example_id < 0:
            continue
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


def _layout(spec: Mapping[str, OutSpec], rows: int) -> dict[str, tuple[int, int]]:
    """Byte offset and size of each field's block in a buffer of ``rows`` rows."""
    offsets, at = {}, 0
    for name, s in spec.items():
        size = rows * math.prod(s.shape) * s.dtype.itemsize
        offsets[name] = (at, size)
        at += -(-size // 64) * 64  # keep every field 64-byte aligned
    return offsets


def _views(buffer: Any, spec: Mapping[str, OutSpec], rows: int) -> dict[str, np.ndarray]:
    return {
        name: np.ndarray((rows, *s.shape), s.dtype, buffer=buffer, offset=offset)
        for name, s in spec.items()
        for offset, _ in [_layout(spec, rows)[name]]
    }


def _attach(name: str) -> tuple[Any, Callable[[], None]]:
    """Maps an existing shared-memory block without registering it for cleanup here."""
    try:  # Python 3.13+
        shm = shared_memory.SharedMemory(name=name, track=False)  # type: ignore[call-arg]
        return shm.buf, shm.close
    except TypeError:
        pass
    path = os.path.join("/dev/shm", name.lstrip("/"))
    fd = os.open(path, os.O_RDWR)
    try:
        mapped = mmap.mmap(fd, 0)
    finally:
        os.close(fd)
    return mapped, mapped.close


def _worker(tasks: Any, results: Any, fn: RecordFn) -> None:
    """A worker process: transform chunks until told to stop."""
    attached: dict[str, tuple[Any, Callable[[], None]]] = {}
    while True:
        task = tasks.get()
        if task is None:
            break
        token, shm_name, rows, spec, start, batch, ids, seed, epoch = task
        try:
            if shm_name not in attached:
                attached[shm_name] = _attach(shm_name)
            outputs = _views(attached[shm_name][0], spec, rows)
            transform_rows(fn, batch, ids, outputs, spec, seed, epoch, start)
            del outputs
            results.put((token, None))
        except BaseException:
            failed = next((int(i) for i in ids if i >= 0), -1)
            results.put((token, (failed, traceback.format_exc())))
    for _, close in attached.values():
        close()


@dataclasses.dataclass
class Ticket:
    """One submitted batch: its shared-memory slot and its chunks still in flight."""

    slot: int
    rows: int
    spec: dict[str, OutSpec]
    chunks: dict[int, tuple[int, np.ndarray]]  # token -> (worker, example ids)


class WorkerPool:
    """W spawned processes that transform chunks of rows into shared-memory slots.

    ``submit`` hands a batch's chunks to the workers and returns at once, so the loader
    can queue the next batches while this one is transformed; ``collect`` waits for one
    batch and copies its rows out of the slot, which is then free for another batch.
    """

    def __init__(self, fn: RecordFn, num_workers: int, *, timeout_s: float = 600.0) -> None:
        self.fn = fn
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        ctx = mp.get_context("spawn")
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(num_workers)]
        self._workers = [
            ctx.Process(
                target=_worker,
                args=(q, self._results, fn),
                daemon=True,
                name=f"meshfeed-worker-{i}",
            )
            for i, q in enumerate(self._tasks)
        ]
        for w in self._workers:
            w.start()
        self._slots: list[shared_memory.SharedMemory] = []
        self._slot_key: tuple[Any, ...] | None = None
        self._free: list[int] = []
        self._done: set[int] = set()
        self._token = 0
        self._next_worker = 0
        self._finalizer = weakref.finalize(
            self, WorkerPool._shutdown, self._workers, self._tasks, self._slots
        )
        atexit.register(self.close)

    def _slot(self, spec: Mapping[str, OutSpec], rows: int) -> int:
        key = (tuple(spec.items()), rows)
        if self._slot_key != key:
            if len(self._free) != len(self._slots):
                raise RuntimeError("record outputs changed shape while batches were in flight.")
            self._release_slots()
            self._slot_key = key
        if not self._free:
            last = list(_layout(spec, rows).values())[-1]
            self._slots.append(
                shared_memory.SharedMemory(create=True, size=max(1, last[0] + last[1]))
            )
            self._free.append(len(self._slots) - 1)
        return self._free.pop()

    def submit(
        self,
        batch: Mapping[str, np.ndarray],
        ids: np.ndarray,
        spec: Mapping[str, OutSpec],
        seed: int,
        epoch: int,
    ) -> Ticket:
        rows = len(ids)
        ticket = Ticket(self._slot(spec, rows), rows, dict(spec), {})
        name = self._slots[ticket.slot].name
        for chunk in np.array_split(np.arange(rows), min(rows, self.num_workers * 2) or 1):
            if not len(chunk):
                continue
            self._token += 1
            worker = self._next_worker
            self._next_worker = (worker + 1) % self.num_workers
            lo, hi = int(chunk[0]), int(chunk[-1]) + 1
            part = {k: v[lo:hi] for k, v in batch.items()}
            task = (self._token, name, rows, ticket.spec, lo, part, ids[lo:hi], seed, epoch)
            self._tasks[worker].put(task)
            ticket.chunks[self._token] = (worker, ids[lo:hi])
        return ticket

    def collect(self, ticket: Ticket, *, keep: bool = True) -> dict[str, np.ndarray]:
        """Waits for ``ticket``'s rows; returns copies of them (``keep=False``: drops them)."""
        self._wait(ticket)
        out: dict[str, np.ndarray] = {}
        if keep:
            views = _views(self._slots[ticket.slot].buf, ticket.spec, ticket.rows)
            out = {k: np.array(v) for k, v in views.items()}  # before the slot is reused
            del views
        self._free.append(ticket.slot)
        return out

    def _wait(self, ticket: Ticket) -> None:
        waited = 0.0
        while any(token not in self._done for token in ticket.chunks):
            try:
                token, error = self._results.get(timeout=_POLL_S)
            except queue.Empty:
                waited += _POLL_S
                self._check_alive(ticket)
                if waited > self.timeout_s:
                    self.close()
                    raise TimeoutError(
                        f"record_transform workers sent nothing for {self.timeout_s} s."
                    ) from None
                continue
            if error is not None:
                example_id, trace = error
                self.close()
                raise RuntimeError(
                    f"record_transform raised on example {example_id} in a worker process:\n{trace}"
                )
            self._done.add(token)
        for token in ticket.chunks:
            self._done.discard(token)

    def _check_alive(self, ticket: Ticket) -> None:
        for token, (worker, ids) in ticket.chunks.items():
            process = self._workers[worker]
            if token not in self._done and not process.is_alive():
                self.close()
                first = next((int(i) for i in ids if i >= 0), -1)
                raise RuntimeError(
                    f"record_transform worker {worker} (pid {process.pid}) died with exit "
                    f"code {process.exitcode} while transforming examples from id {first}; "
                    "the loader stopped its other workers."
                )

    def _release_slots(self) -> None:
        for shm in self._slots:
            shm.unlink()
            shm.close()
        self._slots.clear()
        self._free.clear()

    def close(self) -> None:
        """Stops the workers and unlinks the shared memory. Safe to call twice."""
        self._finalizer.detach()
        WorkerPool._shutdown(self._workers, self._tasks, self._slots)
        self._slots.clear()
        self._free.clear()
        atexit.unregister(self.close)

    @staticmethod
    def _shutdown(workers: list[Any], tasks: list[Any], blocks: list[Any]) -> None:
        for q in tasks:
            with contextlib.suppress(Exception):  # a closed or full queue: the kill below
                q.put_nowait(None)
        for w in workers:
            w.join(timeout=1.0)
            if w.is_alive():
                w.kill()
                w.join(timeout=1.0)
        for q in tasks:
            q.close()
            q.cancel_join_thread()
        for shm in list(blocks):
            # Unlink first: it frees the name even if a view still pins the mapping.
            with contextlib.suppress(FileNotFoundError):
                shm.unlink()
            with contextlib.suppress(BufferError):
                shm.close()


class RecordStage:
    """The loader's per-record step: in its loading thread, or in workers, read ahead.

    ``read(step, rows)`` returns the source's values (zeros for padding) and the example
    ids of those batch rows. With workers, the next ``ahead`` steps' rows are read and
    submitted while the current one is transformed, so the workers never wait for the
    loader; a request for a step that was not queued (after ``restore``) drops the queue.
    """

    def __init__(
        self,
        fn: RecordFn,
        *,
        num_workers: int,
        seed: int,
        read: Callable[[int, np.ndarray], tuple[dict[str, np.ndarray], np.ndarray]],
        epoch_of: Callable[[int], int],
        end: int | None,
        ahead: int,
    ) -> None:
        self.fn, self.num_workers, self.seed = fn, num_workers, seed
        self._read, self._epoch_of, self._end, self._ahead = read, epoch_of, end, ahead
        self.spec: dict[str, OutSpec] | None = None
        self._pool: WorkerPool | None = None
        self._queued: dict[tuple[int, bytes], tuple[Ticket | None, np.ndarray]] = {}
        self._lock = threading.Lock()

    def __call__(self, step: int, rows: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        with self._lock:
            if self.num_workers == 0:
                data, ids = self._read(step, rows)
                return self._in_thread(data, ids, self._epoch_of(step)), ids
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
        assert self.spec is not None
        out = self._zeros(len(ids))
        transform_rows(self.fn, data, ids, out, self.spec, self.seed, epoch)
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
            data, _ = self._read(step, rows)
            return (data if self.spec is None else self._zeros(len(ids))), ids
        assert self._pool is not None
        out = self._pool.collect(ticket)
        padding = ids < 0
        if padding.any():
            for array in out.values():
                array[padding] = 0
        return out, ids

    def _submit(self, step: int, rows: np.ndarray) -> tuple[Ticket | None, np.ndarray]:
        data, ids = self._read(step, rows)
        epoch = self._epoch_of(step)
        if not self._learn(data, ids, epoch):
            return None, ids
        assert self.spec is not None
        if self._pool is None:
            self._pool = WorkerPool(self.fn, self.num_workers)
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


def probe_spec(
    fn: RecordFn, batch: Mapping[str, np.ndarray], ids: np.ndarray, seed: int, epoch: int
) -> dict[str, OutSpec]:
    """The output fields of ``fn``, from its result on the first real row of ``batch``."""
    for i, example_id in enumerate(ids):
        if example_id >= 0:
            out = _check(
                fn(_record(batch, i), record_rng(seed, epoch, example_id)), None, example_id
            )
            return {k: OutSpec(tuple(a.shape), a.dtype) for k, a in out.items()}
    raise ValueError("probe_spec needs at least one real row.")
