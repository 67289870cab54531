"""``worker_type="ray"``: record workers as Ray actors, on any node of a cluster.

``RayWorkers(fn, W, source)`` starts W actors (``_ray_actor.actor_class``) on the
cluster ``_ray_connect.connect`` reaches. Actors, not tasks: each unpickles the
transform and opens the source once and keeps them, and each runs its calls in order,
so the loader keeps every worker's queue full with the steps it reads ahead without
flooding Ray's scheduler; what each reserves (CPUs, a custom resource) is placed once.
A step is cut into as few chunks as keep every worker busy over the steps in flight,
each of at least 32 rows and, once the records are timed, ~0.1 s of work: with the
read-ahead full, a step of cheap records is one call (a call costs this process ~1 ms
of CPU), and a step of slow ones is shared by the workers.

Work is keyed by ``(step, chunk)``: a step's ids are cut into chunks, each chunk a
token, and only ids go out (the actor reads the source itself); finished rows come back
in the call's reply (up to ``_ray_connect.INLINE_BYTES`` on a Ray started with it) or
through Ray's object store, mapped rather than copied, and are copied once, into the
step's rows (reused host memory, ``core._held``). A chunk's rows depend on its ids, the
seed and the epoch alone, so when a worker is lost -- its process killed, its node gone
-- every chunk it had in hand is sent again to the workers left, a new worker is started
in its place (``_ray_crew``), and a reply that still comes from the old call is never
read: each chunk is counted once, whichever call computed it. One line on stderr says
which worker was lost. With no worker left for ``RayOptions.replace_s`` seconds (the
cluster has no room for a new one), the loader raises.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
import time
import weakref
from typing import Any

import numpy as np

from meshfeed.cluster._ray_connect import RayOptions, connect
from meshfeed.core._held import HostBuffers
from meshfeed.workers._processes import send_by_value
from meshfeed.workers._ray_actor import Reply, actor_class
from meshfeed.workers._ray_crew import Chunk, Crew, say_if_too_small
from meshfeed.workers._record_errors import ExampleNames
from meshfeed.workers._record_rows import Dropped, RecordFn, chunks
from meshfeed.workers._shm import Spec

_POLL_S = 0.2
_MIN_ROWS = 32  # a chunk's least rows: a call costs ~1 ms of CPU either side
_CHUNK_S = 0.1  # a chunk's least work, once timed (``chunk_count``)


def chunk_count(rows: int, workers: int, steps: int, busy_s: float, records: int) -> int:
    """How many chunks a step of ``rows`` is cut into: enough to keep ``workers`` busy
    over the ``steps`` in flight (this one among them), and each of at least
    ``_CHUNK_S`` of work once ``records`` took ``busy_s``, but no more. A Ray call costs
    the loading process ~1 ms of CPU either side: cheap records, the read-ahead full, go
    a step to a call rather than W; a slow worker holds up at most a chunk of a step."""
    enough = -(-workers // steps)
    work = int(rows * busy_s / records / _CHUNK_S) + 1 if records else workers
    return min(workers, max(1, rows // _MIN_ROWS), max(enough, work))


@dataclasses.dataclass(eq=False)
class RayTicket:
    """One step's rows handed to the Ray workers: its chunks (none for all-padding ones)."""

    rows: int
    spec: dict[str, Any]
    chunks: list[Chunk]
    open: bool = True  # neither collected nor dropped yet


class RayWorkers:
    """W Ray actors that read ``source`` and run ``fn`` on chunks of example ids; the
    rows come back into arrays from ``buffers`` (``names``: how an error names its
    example)."""

    def __init__(
        self,
        fn: RecordFn,
        num_workers: int,
        source: Any,
        *,
        options: RayOptions,
        buffers: HostBuffers,
        skip: bool = False,
        timeout_s: float = 600.0,
        names: ExampleNames | None = None,
    ) -> None:
        self.num_workers = num_workers
        self.options = options
        self.timeout_s = timeout_s
        self._buffers = buffers
        self._names = names or ExampleNames()
        self._ray = ray = connect(options)
        try:
            source_ref = ray.put(source)
        except Exception as error:
            raise TypeError(
                f"the source cannot be sent to Ray record workers: {type(error).__name__}: "
                f"{error}. Give the loader a source that pickles (a meshfeed folder, files, "
                "URLs or numpy arrays), or use worker_type='processes'."
            ) from None
        init = (list(sys.path), send_by_value(fn), [source_ref], skip)
        ray_class = ray.remote(actor_class()).options(
            num_cpus=options.cpus, resources=dict(options.resources) or None, max_restarts=0
        )
        self._lock = threading.Lock()
        self.busy_s = 0.0
        """Seconds the workers spent on the chunks collected (reads and transforms)."""
        self._crew = Crew(ray, ray_class, init, options)
        self._token = 0
        self._steps = 0  # steps handed over, not yet collected or dropped
        self._records = 0  # the rows of the chunks in busy_s
        self.starved = False  # rows were waited for while a worker had none in hand
        say_if_too_small(ray, options, num_workers)
        for _ in range(num_workers):
            self._crew.start()
        self._finalizer = weakref.finalize(self, Crew.stop, ray, self._crew.actors)

    def submit_ids(self, ids: np.ndarray, spec: Spec, seed: int, epoch: int) -> RayTicket:
        """Hands the examples ``ids`` (-1: padding) to the workers; returns at once."""
        ticket = RayTicket(len(ids), dict(spec), [])
        with self._lock:
            self._steps += 1
            count = chunk_count(len(ids), self.num_workers, self._steps, self.busy_s, self._records)
            for lo, hi in chunks(len(ids), count):
                part = ids[lo:hi]
                if not (part >= 0).any():
                    continue  # all padding: zeros, no call
                self._token += 1
                part = np.ascontiguousarray(part)
                chunk = Chunk(self._token, lo, part, ticket.spec, seed, epoch)
                self._send(chunk)
                ticket.chunks.append(chunk)
        return ticket

    def _send(self, chunk: Chunk) -> None:
        """Sends ``chunk`` to the live worker with the least in hand (started ones first)."""
        again = self._crew.check_started()  # chunks of workers that died starting
        actor = self._crew.pick()
        chunk.actor = actor
        # The ids as bytes and the fields only when they change: a call's arguments
        # are serialised on this thread, a numpy array and the specs ~0.3 ms of 0.74.
        spec = None if actor.spec == chunk.spec else chunk.spec
        actor.spec = chunk.spec
        ids = chunk.ids.astype(np.int64, copy=False).tobytes()
        chunk.ref = actor.handle.run.remote(ids, spec, chunk.seed, chunk.epoch)
        actor.in_hand[chunk.token] = chunk
        for lost in again:
            self._send(lost)

    def collect(self, ticket: RayTicket) -> tuple[dict[str, np.ndarray], Dropped]:
        """Waits for ``ticket``'s rows; returns them, and the records skipped."""
        self._close(ticket)
        out = self._buffers.take(ticket.spec, ticket.rows)
        done = np.zeros(ticket.rows, bool)
        skipped: Dropped = []
        for chunk, reply in zip(ticket.chunks, self._replies(ticket.chunks), strict=True):
            data, chunk_skipped, error, seconds = reply
            with self._lock:
                self.busy_s += seconds
                self._records += len(chunk.ids)
            if error is not None:
                raise RuntimeError(error.message("in a Ray record worker", self._names))
            assert data is not None
            hi = chunk.lo + len(chunk.ids)
            for name, rows in data.items():
                out[name][chunk.lo : hi] = rows
            done[chunk.lo : hi] = True
            skipped += [(chunk.lo + row, i, line) for row, i, line in chunk_skipped]
        if not done.all():
            for array in out.values():
                array[~done] = 0
        return out, skipped

    def _replies(self, chunks: list[Chunk]) -> list[Reply]:
        """The replies to ``chunks``: all at once when they are in (the read-ahead's
        usual case), else one by one, each sent again as often as its worker is lost."""
        refs = [c.ref for c in chunks]
        with contextlib.suppress(Exception):  # a failure: the slow path says what
            ready = self._all_in(refs, 0)
            if not ready:
                self.starved = self.starved or self._some_idle()  # a worker had nothing to do
                ready = self._all_in(refs, _POLL_S)
            if ready:
                replies = self._ray.get(refs)
                with self._lock:
                    for chunk in chunks:
                        if chunk.actor is not None:
                            chunk.actor.in_hand.pop(chunk.token, None)
                return replies
        return [self._result(chunk) for chunk in chunks]

    def _some_idle(self) -> bool:
        """Whether some live worker has every chunk in its hands done (or none)."""
        with self._lock:
            live = [list(a.in_hand.values()) for a in self._crew.actors if not a.lost]
        refs = [c.ref for chunks in live for c in chunks if c.ref is not None]
        done = set(self._ray.wait(refs, num_returns=len(refs), timeout=0)[0]) if refs else set()
        return any(all(c.ref is None or c.ref in done for c in chunks) for chunks in live)

    def _all_in(self, refs: list[Any], timeout_s: float) -> bool:
        """Whether every one of ``refs`` is ready within ``timeout_s``."""
        return len(self._ray.wait(refs, num_returns=len(refs), timeout=timeout_s)[0]) == len(refs)

    def _result(self, chunk: Chunk) -> Reply:
        """The reply to ``chunk``, sent again as often as its worker is lost."""
        ray = self._ray
        waited = time.monotonic()
        while True:
            ref = chunk.ref
            ready, _ = ray.wait([ref], timeout=_POLL_S)
            if ready:
                try:
                    reply = ray.get(ref)
                except Exception as error:
                    if isinstance(error, ray.exceptions.RayTaskError):
                        raise
                    self._redo(chunk, ref, error)
                    continue
                with self._lock:
                    if chunk.actor is not None:
                        chunk.actor.in_hand.pop(chunk.token, None)
                return reply
            with self._lock:
                for lost in self._crew.check_started():
                    self._send(lost)
                self._crew.check_left()
                if self._crew.stuck(chunk):
                    self._send(chunk)  # to a started worker; a late first reply is dropped
            if time.monotonic() - waited > self.timeout_s:
                raise RuntimeError(
                    f"a chunk of record work sent to {chunk.actor and chunk.actor.name(ray)} "
                    f"had no reply for {self.timeout_s:g} s."
                )

    def _redo(self, chunk: Chunk, ref: Any, error: BaseException) -> None:
        """``chunk``'s call failed with its worker (or its rows were lost with a node)."""
        with self._lock:
            if chunk.ref is not ref:
                return  # sent again already (its worker was lost with others in hand)
            actor = chunk.actor
            if actor is not None and not actor.lost:
                for lost in self._crew.lose(actor, error):
                    self._send(lost)
            if chunk.ref is ref:  # not among the lost worker's (its rows were lost after)
                if actor is not None:
                    actor.in_hand.pop(chunk.token, None)
                self._send(chunk)

    def release(self, ticket: RayTicket) -> None:
        """Drops a step never to be collected (its calls run; their replies are dropped)."""
        self._close(ticket)
        with self._lock:
            for chunk in ticket.chunks:
                if chunk.actor is not None:
                    chunk.actor.in_hand.pop(chunk.token, None)
                chunk.ref = None

    def _close(self, ticket: RayTicket) -> None:
        """Counts ``ticket``'s step out of those in flight (once)."""
        with self._lock:
            if ticket.open:
                ticket.open = False
                self._steps -= 1

    def close(self) -> None:
        """Stops the workers. Safe to call twice."""
        self._finalizer()
