"""Per-record transforms, in order, in worker processes, with results in shared memory.

``fn(record, rng) -> record`` runs once per example a process loads (decode, augment).
Its random generator is ``np.random.default_rng([seed, epoch, example_id])``, so the
output depends on nothing but the example, the seed and the epoch: not on the number of
workers, nor on the number of processes.

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
import math
import mmap
import multiprocessing as mp
import os
import queue
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


def record_rng(seed: int, epoch: int, example_id: int) -> np.random.Generator:
    """The generator ``fn`` gets for one example: a function of (seed, epoch, id) alone."""
    return np.random.default_rng([seed, epoch, int(example_id)])


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
    for i, example_id in enumerate(ids):
        if example_id < 0:
            continue
        out = _check(fn(_record(batch, i), record_rng(seed, epoch, example_id)), spec, example_id)
        for name, value in out.items():
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
                for _, close in attached.values():
                    close()
                attached = {shm_name: _attach(shm_name)}
            outputs = _views(attached[shm_name][0], spec, rows)
            transform_rows(fn, batch, ids, outputs, spec, seed, epoch, start)
            del outputs
            results.put((token, None))
        except BaseException:
            failed = next((int(i) for i in ids if i >= 0), -1)
            results.put((token, (failed, traceback.format_exc())))
    for _, close in attached.values():
        close()


class WorkerPool:
    """W spawned processes that transform chunks of rows into one shared-memory block."""

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
        self._shm: shared_memory.SharedMemory | None = None
        self._shm_key: tuple[Any, ...] | None = None
        self._token = 0
        self._finalizer = weakref.finalize(
            self, WorkerPool._shutdown, self._workers, self._tasks, [None]
        )
        atexit.register(self.close)

    def _buffer(self, spec: Mapping[str, OutSpec], rows: int) -> shared_memory.SharedMemory:
        key = (tuple(spec.items()), rows)
        if self._shm is None or self._shm_key != key:
            self._release_shm()
            last = list(_layout(spec, rows).values())[-1]
            self._shm = shared_memory.SharedMemory(create=True, size=max(1, last[0] + last[1]))
            self._shm_key = key
            self._finalizer.detach()
            self._finalizer = weakref.finalize(
                self, WorkerPool._shutdown, self._workers, self._tasks, [self._shm]
            )
        return self._shm

    def transform(
        self,
        batch: Mapping[str, np.ndarray],
        ids: np.ndarray,
        spec: Mapping[str, OutSpec],
        seed: int,
        epoch: int,
    ) -> dict[str, np.ndarray]:
        rows = len(ids)
        shm = self._buffer(spec, rows)
        chunks = np.array_split(np.arange(rows), min(rows, self.num_workers * 2) or 1)
        outstanding: dict[int, tuple[int, np.ndarray]] = {}
        for k, chunk in enumerate(chunks):
            if not len(chunk):
                continue
            self._token += 1
            worker = k % self.num_workers
            part = {name: v[chunk[0] : chunk[-1] + 1] for name, v in batch.items()}
            part_ids = ids[chunk[0] : chunk[-1] + 1]
            self._tasks[worker].put(
                (
                    self._token,
                    shm.name,
                    rows,
                    dict(spec),
                    int(chunk[0]),
                    part,
                    part_ids,
                    seed,
                    epoch,
                )
            )
            outstanding[self._token] = (worker, part_ids)
        self._wait(outstanding)
        views = _views(shm.buf, spec, rows)
        copies = {name: np.array(v) for name, v in views.items()}  # before the block is reused
        del views
        return copies

    def _wait(self, outstanding: dict[int, tuple[int, np.ndarray]]) -> None:
        waited = 0.0
        while outstanding:
            try:
                token, error = self._results.get(timeout=_POLL_S)
            except queue.Empty:
                waited += _POLL_S
                for worker, ids in outstanding.values():
                    process = self._workers[worker]
                    if not process.is_alive():
                        self.close()
                        first = next((int(i) for i in ids if i >= 0), -1)
                        raise RuntimeError(
                            f"record_transform worker {worker} (pid {process.pid}) died with "
                            f"exit code {process.exitcode} while transforming examples from "
                            f"id {first}; the loader stopped its other workers."
                        ) from None
                if waited > self.timeout_s:
                    self.close()
                    raise TimeoutError(
                        f"record_transform workers sent nothing for {self.timeout_s} s."
                    ) from None
                continue
            outstanding.pop(token, None)
            if error is not None:
                example_id, trace = error
                self.close()
                raise RuntimeError(
                    f"record_transform raised on example {example_id} in a worker process:\n{trace}"
                )

    def _release_shm(self) -> None:
        if self._shm is not None:
            self._shm.unlink()
            self._shm.close()
            self._shm = None
            self._shm_key = None

    def close(self) -> None:
        """Stops the workers and unlinks the shared memory. Safe to call twice."""
        self._finalizer.detach()
        WorkerPool._shutdown(self._workers, self._tasks, [self._shm])
        self._shm = None
        self._shm_key = None
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
        for shm in blocks:
            if shm is not None:
                # Unlink first: it frees the name even if a view still pins the mapping.
                with contextlib.suppress(FileNotFoundError):
                    shm.unlink()
                with contextlib.suppress(BufferError):
                    shm.close()


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
