"""Record transforms on a pool of threads in the loading process (``worker_type="threads"``).

No process to start, nothing pickled, no copy between processes: each chunk of a batch's
rows is transformed straight into the batch's output arrays. Threads run in parallel
only where ``fn`` releases the GIL (PIL, OpenCV and most numpy work do) or on a
free-threaded Python; elsewhere worker processes are faster. The output is the same as
with processes or none.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from meshfeed.core._held import HostBuffers
from meshfeed.workers._record_errors import ExampleNames, raise_failure
from meshfeed.workers._record_rows import Dropped, RecordFn, chunks, dropped, transform_rows
from meshfeed.workers._shm import Spec


@dataclasses.dataclass
class ThreadTicket:
    out: dict[str, np.ndarray]
    futures: list[tuple[concurrent.futures.Future[None], np.ndarray]]
    skipped: list[tuple[int, int, str]] | None  # appended to by every chunk's thread
    filtered: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # and this


class ThreadWorkers:
    """``num_workers`` threads that run ``fn`` on chunks of rows into arrays from
    ``buffers`` (``skip``: records that raise become zero rows, listed;
    ``on_error="skip"``); ``names`` names the examples of an error."""

    def __init__(
        self,
        fn: RecordFn,
        num_workers: int,
        *,
        skip: bool = False,
        buffers: HostBuffers,
        names: ExampleNames | None = None,
    ) -> None:
        self.fn = fn
        self.num_workers = num_workers
        self.skip = skip
        self._buffers = buffers
        self._names = names or ExampleNames()
        self.busy_s = 0.0
        """Seconds the threads spent on chunks."""
        self.starved = False
        """Rows were waited for while a thread had no chunk to run."""
        self._in_flight = 0  # chunks submitted and not yet finished
        self._lock = threading.Lock()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            num_workers, thread_name_prefix="meshfeed-record"
        )

    def submit(
        self, batch: Mapping[str, np.ndarray], ids: np.ndarray, spec: Spec, seed: int, epoch: int
    ) -> ThreadTicket:
        out = self._buffers.take(spec, len(ids))  # padding rows are zeroed when collected
        ticket = ThreadTicket(out, [], [] if self.skip else None)
        for lo, hi in chunks(len(ids), 2 * self.num_workers):
            part = {k: v[lo:hi] for k, v in batch.items()}
            future = self._executor.submit(
                self._timed,
                self.fn,
                part,
                ids[lo:hi],
                out,
                lo,
                seed,
                epoch,
                None,
                ticket.skipped,
                ticket.filtered,
            )
            ticket.futures.append((future, ids[lo:hi]))
            with self._lock:
                self._in_flight += 1
        return ticket

    def _timed(self, *args: Any) -> None:
        began = time.perf_counter()
        try:
            transform_rows(*args)
        finally:
            seconds = time.perf_counter() - began
            with self._lock:
                self.busy_s += seconds
                self._in_flight -= 1

    def collect(self, ticket: ThreadTicket) -> tuple[dict[str, np.ndarray], Dropped]:
        if self._in_flight < self.num_workers and not all(f.done() for f, _ in ticket.futures):
            self.starved = True  # about to wait while a thread has nothing to run
        for future, ids in ticket.futures:
            error = future.exception()
            if error is not None:
                raise_failure(error, ids, "in a worker thread", self._names)
        return ticket.out, dropped(ticket.skipped, ticket.filtered)

    def release(self, ticket: ThreadTicket) -> None:
        """Drops a batch never to be collected: its chunks not yet started never run."""
        for future, _ in ticket.futures:
            if future.cancel():
                with self._lock:
                    self._in_flight -= 1

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
