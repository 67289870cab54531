"""Per-record transforms, in order, in the loading thread, worker threads or processes.

With ``num_workers=0`` the records are transformed in the loading thread. With ``W > 0``
a batch's rows are cut into chunks that W workers transform in parallel: processes
(``_workers``, writing into shared memory) or threads (``_thread_workers``). Several
steps may be in flight at once (the pipeline reads ahead on several threads), so the
workers always have queued chunks. The output fields are learnt from the first real
example; every later record must match them.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Literal, Protocol

import numpy as np

from meshfeed.data._sources import FieldSpec
from meshfeed.workers._record_rows import RecordFn, probe_spec, transform_rows
from meshfeed.workers._shm import Spec
from meshfeed.workers._thread_workers import ThreadWorkers
from meshfeed.workers._workers import WorkerPool

WorkerType = Literal["processes", "threads"]
"""Where ``record_transform`` runs: worker processes (the default) or threads."""
WORKER_TYPES: tuple[WorkerType, ...] = ("processes", "threads")


class StepRows(Protocol):
    """What the record stage reads from: the source's rows of a step, and their epochs."""

    def read(self, step: int, rows: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The source's values of these batch rows (zeros for padding), and their ids."""
        ...

    def epochs(self, step: int, rows: np.ndarray) -> np.ndarray:
        """The epoch of each of these rows (a step may straddle two)."""
        ...


class Workers(Protocol):
    """A pool that transforms a batch's rows in chunks: ``WorkerPool`` or ``ThreadWorkers``."""

    def submit(
        self, batch: Mapping[str, np.ndarray], ids: np.ndarray, spec: Spec, seed: int, epoch: int
    ) -> Any: ...

    def collect(self, ticket: Any) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...


class RecordStage:
    """Record transforms for the rows of each step: in the calling thread, or in workers.

    Safe to call from several threads at once, for different steps: each call reads its
    rows, hands them to the workers and waits for its own, so the steps that the pipeline
    reads ahead keep the workers busy.
    """

    def __init__(
        self,
        fn: RecordFn,
        *,
        num_workers: int,
        worker_type: WorkerType,
        seed: int,
        source_rows: StepRows,
    ) -> None:
        self.fn, self.num_workers, self.worker_type, self.seed = fn, num_workers, worker_type, seed
        self._rows = source_rows
        self.spec: dict[str, FieldSpec] | None = None
        self._pool: Workers | None = None
        self._lock = threading.Lock()

    def __call__(self, step: int, rows: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The transformed values of these batch rows of ``step``, and their ids."""
        epochs = self._rows.epochs(step, rows)
        if len(epochs) == 0 or (epochs == epochs[0]).all():
            return self._rows_of_epoch(step, rows, int(epochs[0]) if len(epochs) else 0)
        # A step that straddles two epochs: each row's generator keys on its own epoch.
        out: dict[str, np.ndarray] = {}
        ids = np.empty(len(rows), np.int64)
        for e in np.unique(epochs).tolist():
            at = epochs == e
            data, ids[at] = self._rows_of_epoch(step, rows[at], e)
            for name, values in data.items():
                if name not in out:
                    out[name] = np.empty((len(rows), *values.shape[1:]), values.dtype)
                out[name][at] = values
        return out, ids

    def _rows_of_epoch(
        self, step: int, rows: np.ndarray, epoch: int
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        data, ids = self._rows.read(step, rows)
        real = ids >= 0
        with self._lock:
            if self.spec is None:
                if not real.any():
                    return data, ids  # only padding so far: nothing to learn the output from
                self.spec = probe_spec(self.fn, data, ids, self.seed, epoch)
            spec = self.spec
            if self.num_workers and self._pool is None:
                self._pool = self._start()
            pool = self._pool
        if not real.any():
            return {k: np.zeros((len(ids), *s.shape), s.dtype) for k, s in spec.items()}, ids
        if pool is None:
            out = {k: np.zeros((len(ids), *s.shape), s.dtype) for k, s in spec.items()}
            transform_rows(self.fn, data, ids, out, 0, self.seed, epoch)
            return out, ids
        out = pool.collect(pool.submit(data, ids, spec, self.seed, epoch))
        if not real.all():
            for array in out.values():
                array[~real] = 0
        return out, ids

    def _start(self) -> Workers:
        if self.worker_type == "threads":
            return ThreadWorkers(self.fn, self.num_workers)
        return WorkerPool(self.fn, self.num_workers)

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None
