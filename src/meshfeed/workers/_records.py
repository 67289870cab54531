"""Per-record transforms, in order, in the loading thread, worker threads or processes.

With ``num_workers=0`` the records are transformed in the loading thread. With ``W > 0``
a batch's rows are cut into chunks that W workers transform in parallel: processes
(``_workers``, writing into shared memory) or threads (``_thread_workers``). Handing
rows to the workers returns at once with a ``Pending``, and whoever needs the rows
collects them (``Pending.result``): the read-ahead hands the next steps' rows over and
the consumer collects each step when it needs it, so several steps are in the workers'
hands at once and no thread waits on them but the one that needs the rows. The output
fields are learnt from the first real example; every later record must match them.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping
from typing import Any, Literal, Protocol

import numpy as np

from meshfeed.cluster._ray_connect import RayOptions
from meshfeed.core._held import HostBuffers
from meshfeed.core._tally import Tally
from meshfeed.data._sources import FieldSpec
from meshfeed.workers._pending import Handed, Pending, Rows, Workers, skipping
from meshfeed.workers._ray_workers import RayWorkers
from meshfeed.workers._record_errors import ExampleNames, RecordFailed, raise_failure
from meshfeed.workers._record_rows import (
    RecordFn,
    dropped,
    probe_source,
    probe_spec,
    transform_rows,
)
from meshfeed.workers._thread_workers import ThreadWorkers
from meshfeed.workers._workers import WorkerPool

WorkerType = Literal["processes", "threads", "ray"] | RayOptions
"""Where ``record_transform`` runs: worker processes (the default), threads, or Ray
actors on a cluster (``"ray"``, or ``RayOptions(...)`` for what each reserves)."""
WORKER_TYPES: tuple[str, ...] = ("processes", "threads", "ray")


class StepRows(Protocol):
    """What the record stage reads from: the source's rows of a step, their example ids
    and epochs, and the source itself (which Ray workers read on their own)."""

    @property
    def source(self) -> Any: ...

    def ids(self, step: int, rows: np.ndarray) -> np.ndarray:
        """The example ids of these batch rows (-1: padding)."""
        ...

    def read(self, step: int, rows: np.ndarray) -> Rows:
        """The source's values of these batch rows (zeros for padding and for examples
        whose read failed under ``on_error="skip"``), and their ids."""
        ...

    def epochs(self, step: int, rows: np.ndarray) -> np.ndarray:
        """The epoch of each of these rows (a step may straddle two)."""
        ...

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        """The source's fields."""
        ...

    def can_read_into(self) -> bool:
        """Whether ``read_into`` may work for this source."""
        ...

    def read_into(self, step: int, rows: np.ndarray, out: Mapping[str, np.ndarray]) -> Rows | None:
        """These rows read straight into ``out``, or ``None`` (then ``read``)."""
        ...

    def read_elsewhere(self, step: int, rows: np.ndarray) -> np.ndarray | None:
        """These rows' ids, counted as read by the workers; ``None`` if some are padding."""
        ...


class RecordStage:
    """Record transforms for the rows of each step: in the calling thread, or in workers.

    Safe to call from several threads at once, for different steps. With workers a call
    reads the rows, hands them over and returns a ``Pending`` at once. ``read_ahead``:
    the most steps and bytes the loader reads ahead (what worker processes' shared
    memory is planned for).
    """

    def __init__(
        self,
        fn: RecordFn,
        *,
        num_workers: int,
        worker_type: WorkerType,
        seed: int,
        source_rows: StepRows,
        read_ahead: tuple[int, int] = (1, 1),
        skip: bool = False,
    ) -> None:
        self.fn = fn
        self.num_workers = num_workers
        self.worker_type: WorkerType = worker_type
        self.seed = seed
        self._rows = source_rows
        self._read_ahead = read_ahead
        self.skip = skip
        self.spec: dict[str, FieldSpec] | None = None
        self._pool: Workers | None = None
        self._lock = threading.Lock()
        self.tally = Tally("records", "seconds", "skipped", "filtered")
        """Records transformed (skipped and filtered ones among them) and seconds in this
        process."""
        self._busy_before = 0.0  # seconds of pools closed (restarted) before this one
        self._buffers = HostBuffers()  # the rows of threads, Ray and this thread, reused
        self._read_into = source_rows.can_read_into()
        self._names = ExampleNames(source_rows.source)  # an error's example, and its file
        if num_workers and (worker_type == "ray" or isinstance(worker_type, RayOptions)):
            self._pool = self._start_pool()  # now, on the loader's thread (_ray_connect)

    def __call__(self, step: int, rows: np.ndarray) -> Rows | Pending:
        """The transformed values of these batch rows of ``step`` and their ids, or, with
        workers, a ``Pending`` for them."""
        epochs = self._rows.epochs(step, rows)
        parts: list[tuple[np.ndarray | None, Any]]
        if len(epochs) == 0 or (epochs == epochs[0]).all():
            parts = [(None, self._start(step, rows, int(epochs[0]) if len(epochs) else 0))]
        else:  # a step that straddles two epochs: each row's generator keys on its own
            parts = []
            for e in np.unique(epochs).tolist():
                at = epochs == e
                parts.append((at, self._start(step, rows[at], e)))
        pending = Pending(len(rows), parts)
        return pending if any(isinstance(p, Handed) for _, p in parts) else pending.result()

    def _start(self, step: int, rows: np.ndarray, epoch: int) -> Rows | Handed:
        pool = self._pool
        if isinstance(pool, RayWorkers) and self.spec is not None:  # only ids go out
            return self._hand_ids(pool, Rows({}, self._rows.ids(step, rows), []), epoch)
        staged = isinstance(pool, WorkerPool) and (self._read_into or pool.shared is not None)
        if isinstance(pool, WorkerPool) and self.spec is not None and staged:
            handed = self._hand_staged(pool, step, rows, epoch)
            if handed is not None:
                return handed
        read = self._rows.read(step, rows)
        data, ids = read.data, read.ids
        real = ids >= 0
        with self._lock:
            if self.spec is None:
                if not real.any():
                    return read  # only padding so far: nothing to learn the output from
                self.spec = self._probe(data, ids, epoch)
            spec = self.spec
            if self.num_workers and self._pool is None:
                self._pool = self._start_pool()
            pool = self._pool
        if not real.any():
            out = {k: np.zeros((len(ids), *s.shape), s.dtype) for k, s in spec.items()}
            return Rows(out, ids, read.skipped)
        if pool is None:
            out = self._buffers.take(spec, len(ids))  # padding rows zeroed by skipping
            skipped: list[tuple[int, int, str]] | None = [] if self.skip else None
            filtered: list[tuple[int, int]] = []
            began = time.perf_counter()
            try:
                transform_rows(
                    self.fn, data, ids, out, 0, self.seed, epoch, None, skipped, filtered
                )
            except RecordFailed as error:
                raise_failure(error, ids, "in the loading process", self._names)
            seconds = time.perf_counter() - began
            self.tally.add(int(np.count_nonzero(real)), seconds, len(skipped or []), len(filtered))
            return skipping(out, read, dropped(skipped, filtered))
        if isinstance(pool, RayWorkers):  # the first rows, read here to learn the output
            return self._hand_ids(pool, Rows({}, ids, read.skipped), epoch)
        if isinstance(pool, WorkerPool) and pool.shared is not None and real.all():
            ticket = pool.submit_staged(None, ids, spec, self.seed, epoch)  # rows there too
        else:
            ticket = pool.submit(data, ids, spec, self.seed, epoch)
        nbytes = len(ids) * self._row_bytes()
        records = int(np.count_nonzero(real))
        return Handed(pool, ticket, read, nbytes, self.tally, records)

    def _probe(self, data: Mapping[str, Any], ids: np.ndarray, epoch: int) -> dict[str, FieldSpec]:
        """``probe_spec`` here, in the loading process, its error named as any other;
        where ``fn`` dropped every row, ``probe_source``."""
        try:
            got = probe_spec(self.fn, data, ids, self.seed, epoch, skip=self.skip)
            if got is None:  # every row dropped: probe the source's examples
                got = probe_source(self.fn, self._rows.source, self.seed, epoch, self.skip)
            return got
        except RecordFailed as error:
            raise_failure(error, ids, "in the loading process", self._names)

    def _hand_staged(
        self, pool: WorkerPool, step: int, rows: np.ndarray, epoch: int
    ) -> Handed | None:
        """The rows read straight into the workers' input block (one copy, not two), or
        only their ids where the workers read the source's copy in shared memory; ``None``
        where the source could not (padding, a failed read: ``read`` then)."""
        assert self.spec is not None
        if pool.shared is not None:
            if (ids := self._rows.read_elsewhere(step, rows)) is None:
                return None
            ticket = pool.submit_staged(None, ids, self.spec, self.seed, epoch)
            nbytes = len(rows) * self._row_bytes()
            return Handed(pool, ticket, Rows({}, ids, []), nbytes, self.tally, len(rows))
        staged = pool.stage(self._rows.fields, len(rows))
        read = self._rows.read_into(step, rows, staged.rows)
        if read is None:
            pool.unstage(staged)
            return None
        ticket = pool.submit_staged(staged, read.ids, self.spec, self.seed, epoch)
        read = Rows({}, read.ids, [])  # the rows are the workers' now: no view of them kept
        return Handed(pool, ticket, read, len(rows) * self._row_bytes(), self.tally, len(rows))

    def _hand_ids(self, pool: RayWorkers, read: Rows, epoch: int) -> Rows | Handed:
        assert self.spec is not None
        if not (read.ids >= 0).any():
            out = {k: np.zeros((len(read.ids), *s.shape), s.dtype) for k, s in self.spec.items()}
            return Rows(out, read.ids, read.skipped)
        ticket = pool.submit_ids(read.ids, self.spec, self.seed, epoch)
        nbytes = len(read.ids) * self._row_bytes()
        records = int(np.count_nonzero(read.ids >= 0))
        return Handed(pool, ticket, read, nbytes, self.tally, records)

    def _row_bytes(self) -> int:
        assert self.spec is not None
        return sum(math.prod(s.shape) * np.dtype(s.dtype).itemsize for s in self.spec.values())

    def _start_pool(self) -> Workers:
        return start_pool(
            self.fn,
            self.num_workers,
            self.worker_type,
            self._rows.source,
            read_ahead=self._read_ahead,
            skip=self.skip,
            names=self._names,
            buffers=self._buffers,
        )

    def steps_ahead(self) -> int | None:
        """The most steps the workers' shared memory lets the read-ahead hold (``None``:
        no bound of theirs)."""
        return getattr(self._pool, "steps_ahead", None)

    def starved(self) -> bool:
        """Whether, since the last call, rows were waited for while some worker had
        nothing in hand (more steps ahead would have kept it busy)."""
        pool = self._pool
        if not getattr(pool, "starved", False):
            return False
        pool.starved = False  # type: ignore[union-attr]
        return True

    def lent(self) -> int:
        """Steps' rows out now in memory lent to arrays (a slot of the workers', or a
        host buffer of this stage's), not yet given back."""
        slots = getattr(self._pool, "lent_slots", 0)
        return int(slots) + self._buffers.lent

    def counts(self) -> dict[str, float]:
        """Records transformed, records skipped, and seconds spent on them: in this
        process, plus what the workers report (with Ray, their reads of the source too)."""
        counts = self.tally.values()
        counts["seconds"] += self._busy_before + getattr(self._pool, "busy_s", 0.0)
        return counts

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._busy_before += getattr(self._pool, "busy_s", 0.0)
                self._pool.close()
                self._pool = None


def start_pool(
    fn: RecordFn,
    count: int,
    kind: WorkerType,
    source: Any,
    *,
    read_ahead: tuple[int, int],
    skip: bool,
    names: ExampleNames,
    buffers: HostBuffers,
) -> Workers:
    """The ``count`` workers of ``kind`` that run ``fn``: threads, Ray actors (which read
    ``source`` themselves), or worker processes (given ``source``'s arrays in memory)."""
    if kind == "threads":
        return ThreadWorkers(fn, count, skip=skip, buffers=buffers, names=names)
    if kind == "ray" or isinstance(kind, RayOptions):
        options = kind if isinstance(kind, RayOptions) else RayOptions()
        return RayWorkers(  # type: ignore[return-value]  # submit_ids, not submit
            fn, count, source, options=options, buffers=buffers, skip=skip, names=names
        )
    memory = getattr(source, "memory_arrays", lambda: None)
    return WorkerPool(
        fn, count, read_ahead=read_ahead, skip=skip, names=names, source_arrays=memory()
    )
