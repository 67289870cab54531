"""A pool of worker processes that transform chunks of rows into shared-memory slots.

``WorkerPool(fn, W)`` starts W processes (``_processes``: ``python -c``, nothing of the
user's script run again, no process running JAX forked, ``fn`` sent by value).
``submit`` cuts a batch's rows into chunks, writes their rows into a shared-memory input
block (``put_rows``) and sends each chunk's small task to the worker with the fewest in
hand; it returns at once. ``stage`` and ``submit_staged`` do the same for rows a source
reads straight into the input block (``ArraySource.read_into``: one copy, not two), and
``submit_staged(None, ...)`` sends only the ids of rows the workers read themselves, out
of an in-memory source copied into shared memory once (``_shared_rows``: no copy a step).
``collect`` waits for one batch and lends its rows out of their slot (``Slots.lend``:
the slot is reused once no array points at them; past a few lent, a copy);
``release`` drops a batch never to be collected (its slot is reused once its chunks are
done). Several threads may submit and collect at once: whichever waits reads the
workers' replies for all of them.

A worker's exception, or its death (its reply pipe ends), becomes an error within a
poll interval that names the example it was transforming and the worker's last line on
stderr; the pool then stops its other workers and unlinks its shared memory, as it does
on close and at exit.
"""

from __future__ import annotations

import dataclasses
import functools
import pickle
import sys
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from meshfeed.workers._layouts import (
    IDS,
    Layout,
    Spec,
    Staged,
    prepare_rows,
    put_rows,
)
from meshfeed.workers._processes import (
    Crew,
    WorkerProcess,
    send_by_value,
    stop,
)
from meshfeed.workers._record_errors import ExampleNames
from meshfeed.workers._record_rows import Dropped, RecordFn, chunks
from meshfeed.workers._shm import PoolBlocks
from meshfeed.workers._worker_loop import STATUS_STRIDE

_POLL_S = 0.05


@dataclasses.dataclass
class Ticket:
    """One submitted batch: its output slot, its input block and its chunks in flight."""

    slot: int
    block: int | None  # its input block (None: the rows are the shared source's)
    rows: int
    spec: dict[str, Any]
    chunks: list[int]  # tokens


class DoneChunks:
    """The chunks the workers have finished, with the records each dropped, until their
    ticket is collected; and the tickets released before all their chunks were done,
    whose slot and block go back to ``blocks`` once they are. Used under the pool's lock.
    """

    def __init__(self, blocks: PoolBlocks) -> None:
        self._blocks = blocks
        self._done: dict[int, Dropped] = {}  # token -> records skipped or filtered
        self._released: list[Ticket] = []  # dropped, their chunks not all done yet

    def finished(self, ticket: Ticket) -> bool:
        """Whether every chunk of ``ticket`` is done."""
        return all(token in self._done for token in ticket.chunks)

    def take(self, ticket: Ticket) -> Dropped:
        """The records ``ticket``'s chunks dropped (they are all done), forgotten here."""
        return [s for token in ticket.chunks for s in self._done.pop(token)]

    def add(self, token: int, dropped: Dropped) -> None:
        """Chunk ``token`` is done, having dropped ``dropped``."""
        self._done[token] = dropped
        if self._released:
            self._give_back_released()

    def release(self, ticket: Ticket) -> None:
        """``ticket`` will not be collected: its slot and block go back once it is done."""
        self._released.append(ticket)
        self._give_back_released()

    def _give_back_released(self) -> None:
        for ticket in list(self._released):
            if self.finished(ticket):
                for token in ticket.chunks:
                    del self._done[token]
                self._released.remove(ticket)
                self._blocks.give_back(ticket.slot, ticket.spec, ticket.rows, ticket.block)


class WorkerPool:
    """W worker processes that run ``fn`` on chunks of rows into shared-memory slots
    (``read_ahead``: the most steps and bytes the loader's read-ahead holds; ``PoolBlocks``).
    ``shared``: ``source_arrays`` copied into shared memory, for the workers to read
    (``submit_staged(None, ...)``), or ``None`` where they are not given or do not fit."""

    def __init__(
        self,
        fn: RecordFn,
        num_workers: int,
        *,
        read_ahead: tuple[int, int] = (1, 1),
        skip: bool = False,
        timeout_s: float = 600.0,
        names: ExampleNames | None = None,
        source_arrays: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        payload = pickle.dumps((list(sys.path), send_by_value(fn), skip))
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self._blocks = PoolBlocks(STATUS_STRIDE * num_workers, read_ahead)
        self._slots, self._inputs = self._blocks.slots, self._blocks.inputs
        self.shared = None if source_arrays is None else self._blocks.share(source_arrays)
        in_hand = functools.partial(self._blocks.example_in_hand, stride=STATUS_STRIDE)
        self._crew = Crew(num_workers, self._blocks.status.name, payload, names, in_hand)
        # Also at exit (finalize runs then); an atexit hook would keep the pool alive.
        self._finalizer = weakref.finalize(self, _shutdown, self._crew.workers, self._blocks)
        self._cond = threading.Condition()
        self._chunks = DoneChunks(self._blocks)
        self._failure: str | None = None
        self._receiving = False  # a thread reads the replies
        self._heard = time.monotonic()  # when a reply last came
        self._token = 0
        self.busy_s = 0.0  # seconds on chunks, as replies say
        self.starved = False  # rows were waited for while a worker had none in hand

    def submit(
        self, batch: Mapping[str, np.ndarray], ids: np.ndarray, spec: Spec, seed: int, epoch: int
    ) -> Ticket:
        """Queues ``batch``'s rows (example ids ``ids``) for the workers; returns at once."""
        # One chunk a worker: the steps read ahead keep every worker's queue full.
        bounds = chunks(len(ids), self.num_workers)
        parts = [
            prepare_rows({**{k: v[lo:hi] for k, v in batch.items()}, IDS: ids[lo:hi]})
            for lo, hi in bounds
        ]
        size = sum(size for _, size in parts)
        with self._cond:
            self._raise_if_failed()
            self._blocks.plan(spec, len(ids), size)  # the first rows: what fits, and where
            block, layouts, at = self._inputs.take(size), [], 0
            buffer = self._inputs.buffer(block)
            for prepared, _ in parts:
                chunk, at = put_rows(buffer, at, prepared)
                layouts.append(chunk)
            del buffer
            return self._queue(block, layouts, bounds, ids, spec, seed, epoch)

    def _queue(
        self,
        block: int | None,
        layouts: list[Layout],
        bounds: list[tuple[int, int]],
        ids: np.ndarray,
        spec: Spec,
        seed: int,
        epoch: int,
    ) -> Ticket:
        """A ticket for rows laid out in input block ``block`` (``None``: ``shared``), a
        chunk ``[lo, hi)`` for each layout, each sent to the worker with the fewest in
        hand (under the lock)."""
        rows, spec = len(ids), dict(spec)
        ticket = Ticket(self._slots.take(spec, rows), block, rows, spec, [])
        inputs, slot = self._blocks.input_name(block), self._slots.name(ticket.slot)
        for chunk, (lo, hi) in zip(layouts, bounds, strict=True):
            self._token += 1
            task = (self._token, inputs, chunk, slot, rows, spec, lo, seed, epoch)
            dead = self._crew.send(self._token, task, ids[lo:hi])
            if dead is not None:
                self._fail(self._crew.death(dead))
                self._raise_if_failed()
            ticket.chunks.append(self._token)
        return ticket

    def stage(self, fields: Spec, rows: int) -> Staged:
        """An input block for ``rows`` rows of ``fields`` (fixed-size, numeric), as
        arrays to read into (``_layouts.stage``); then ``submit_staged``, or ``unstage``."""
        with self._cond:
            self._raise_if_failed()
            return self._blocks.stage(fields, rows)

    def unstage(self, staged: Staged) -> None:
        """Gives back a staged block that was not submitted."""
        with self._cond:
            self._inputs.give_back(staged.block)

    def submit_staged(
        self, staged: Staged | None, ids: np.ndarray, spec: Spec, seed: int, epoch: int
    ) -> Ticket:
        """Queues the rows read into ``staged`` (example ids ``ids``), or with ``None``
        the rows ``ids`` the workers read out of ``shared`` themselves; returns at once."""
        bounds = chunks(len(ids), self.num_workers)
        if staged is not None:
            staged.hand_over(ids)
        with self._cond:
            self._raise_if_failed()
            self._blocks.plan(spec, len(ids), self._blocks.input_bytes(staged))
            layouts = [self._blocks.chunk(staged, ids, lo, hi) for lo, hi in bounds]
            block = staged.block if staged is not None else None
            return self._queue(block, layouts, bounds, ids, spec, seed, epoch)

    def collect(self, ticket: Ticket) -> tuple[dict[str, np.ndarray], Dropped]:
        """Waits for ``ticket``'s rows; returns them, and the records skipped.

        The rows are the slot's memory, lent (``Slots.lend``: the slot is reused once
        no array points at them), or copies when enough slots are out already.
        """
        skipped = self._wait(ticket)
        slot, spec, rows = ticket.slot, ticket.spec, ticket.rows
        with self._cond:
            lent = self._slots.may_lend(slot)
        out = (self._slots.lend if lent else self._slots.copy_out)(slot, spec, rows)
        with self._cond:
            self._blocks.give_back(None if lent else slot, spec, rows, ticket.block)
        return out, skipped

    def release(self, ticket: Ticket) -> None:
        """Drops ``ticket``'s batch: its slot and block are reused once its chunks are done
        (a worker may still be writing into the slot)."""
        with self._cond:
            self._chunks.release(ticket)

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise RuntimeError(self._failure)

    def _wait(self, ticket: Ticket) -> Dropped:
        with self._cond:
            while True:
                self._raise_if_failed()
                if self._chunks.finished(ticket):
                    return self._chunks.take(ticket)
                if not self.starved and self._crew.idle():
                    self.starved = True  # waited while a worker had nothing to do
                if self._receiving:  # another thread reads the replies; it will wake us
                    self._cond.wait(_POLL_S)
                    continue
                self._receiving = True
                self._cond.release()
                try:
                    self._receive()
                finally:
                    self._cond.acquire()
                    self._receiving = False
                    self._cond.notify_all()

    def _receive(self) -> None:
        """Reads the replies that arrive within one poll interval (without the lock)."""
        heard = False
        for worker, token, done in self._crew.replies(_POLL_S):
            heard = True
            if token is None:  # a failure, or a pipe that ended
                if self._failure is None:  # not a pipe this pool closed itself
                    self._fail(done or self._crew.death(worker))
                return
            dropped, seconds = done
            with self._cond:
                self._chunks.add(token, dropped)
                self.busy_s += seconds
        if heard:
            self._heard = time.monotonic()
        elif time.monotonic() - self._heard > self.timeout_s:
            self._fail(f"record_transform workers sent nothing for {self.timeout_s} s.")

    def _fail(self, message: str) -> None:
        with self._cond:
            if self._failure is None:
                self._failure = message
            self._cond.notify_all()
        self.close()

    def close(self) -> None:
        """Stops the workers and unlinks the shared memory. Safe to call twice."""
        with self._cond:
            if self._failure is None:
                self._failure = "the record workers were stopped: the loader was closed."
            self._cond.notify_all()
        self._finalizer()

    @property
    def lent_slots(self) -> int:
        """Slots whose rows are out, lent to arrays (``Slots.lend``)."""
        return self._slots.lent

    @property
    def steps_ahead(self) -> int | None:
        """The most steps /dev/shm lets the read-ahead hold (``None``: no bound)."""
        return self._blocks.steps_ahead


def _shutdown(workers: list[WorkerProcess], blocks: PoolBlocks) -> None:
    stop(workers)
    blocks.close()
