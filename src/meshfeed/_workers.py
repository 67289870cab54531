"""A pool of worker processes that fill shared-memory slots, chunk by chunk, in order.

``WorkerPool(work, W)`` starts W processes with ``spawn`` (forking a process that runs
JAX is unsafe). ``submit`` cuts a batch's rows into chunks, sends each chunk's input
through a pipe to a worker, and returns at once, so the caller can queue the next
batches while this one is worked on; the worker runs ``work(part, ids, outputs, start,
*args)``, writing its rows straight into the batch's shared-memory slot. ``collect``
waits for one batch -- with a timeout, watching that every worker is alive -- and copies
its rows out. A worker's exception or death becomes an error naming the example id; the
pool then stops its other workers and unlinks its shared memory, as it does on close
and at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import multiprocessing as mp
import queue
import traceback
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from meshfeed._shm import Slots, Spec, attach, unlink_all, views

Work = Callable[..., None]  # work(part, ids, outputs, start, *args)
EXAMPLE_ID = "meshfeed_example_id"  # set on an exception by the work that raised it
_POLL_S = 0.05


def _worker(tasks: Any, results: Any, work: Work) -> None:
    """A worker process: run ``work`` on chunks until told to stop."""
    attached: dict[str, tuple[Any, Callable[[], None]]] = {}
    while True:
        task = tasks.get()
        if task is None:
            break
        token, shm_name, rows, spec, start, part, ids, args = task
        try:
            if shm_name not in attached:
                attached[shm_name] = attach(shm_name)
            outputs = views(attached[shm_name][0], spec, rows)
            work(part, ids, outputs, start, *args)
            del outputs
            results.put((token, None))
        except BaseException as error:
            first = next((int(i) for i in ids if i >= 0), -1)
            failed = getattr(error, EXAMPLE_ID, first)
            results.put((token, (failed, traceback.format_exc())))
    for _, close in attached.values():
        close()


@dataclasses.dataclass
class Ticket:
    """One submitted batch: its shared-memory slot and its chunks still in flight."""

    slot: int
    rows: int
    spec: dict[str, Any]
    chunks: dict[int, tuple[int, np.ndarray]]  # token -> (worker, example ids)


class WorkerPool:
    """W spawned processes that run ``work`` on chunks of rows into shared-memory slots."""

    def __init__(self, work: Work, num_workers: int, *, timeout_s: float = 600.0) -> None:
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        ctx = mp.get_context("spawn")
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(num_workers)]
        self._workers = [
            ctx.Process(
                target=_worker,
                args=(q, self._results, work),
                daemon=True,
                name=f"meshfeed-worker-{i}",
            )
            for i, q in enumerate(self._tasks)
        ]
        for w in self._workers:
            w.start()
        self._slots = Slots()
        self._done: set[int] = set()
        self._token = 0
        self._next_worker = 0
        self._finalizer = weakref.finalize(
            self, WorkerPool._shutdown, self._workers, self._tasks, self._slots.blocks
        )
        atexit.register(self.close)

    def submit(
        self, batch: Mapping[str, np.ndarray], ids: np.ndarray, spec: Spec, *args: Any
    ) -> Ticket:
        """Queues ``batch``'s rows (example ids ``ids``) for the workers; returns at once."""
        rows = len(ids)
        ticket = Ticket(self._slots.take(spec, rows), rows, dict(spec), {})
        name = self._slots.name(ticket.slot)
        for chunk in np.array_split(np.arange(rows), min(rows, self.num_workers * 2) or 1):
            if not len(chunk):
                continue
            self._token += 1
            worker = self._next_worker
            self._next_worker = (worker + 1) % self.num_workers
            lo, hi = int(chunk[0]), int(chunk[-1]) + 1
            part = {k: v[lo:hi] for k, v in batch.items()}
            task = (self._token, name, rows, ticket.spec, lo, part, ids[lo:hi], args)
            self._tasks[worker].put(task)
            ticket.chunks[self._token] = (worker, ids[lo:hi])
        return ticket

    def collect(self, ticket: Ticket, *, keep: bool = True) -> dict[str, np.ndarray]:
        """Waits for ``ticket``'s rows; returns copies of them (``keep=False``: drops them)."""
        self._wait(ticket)
        out = self._slots.copy_out(ticket.slot, ticket.spec, ticket.rows) if keep else {}
        self._slots.give_back(ticket.slot)
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

    def close(self) -> None:
        """Stops the workers and unlinks the shared memory. Safe to call twice."""
        self._finalizer.detach()
        WorkerPool._shutdown(self._workers, self._tasks, self._slots.blocks)
        self._slots.close()
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
        unlink_all(blocks)
