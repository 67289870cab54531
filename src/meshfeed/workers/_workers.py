"""A pool of worker processes that transform chunks of rows into shared-memory slots.

``WorkerPool(fn, W)`` starts W processes with ``python -c`` (``_worker_loop``): nothing of
the user's script runs again in them, no process running JAX is forked, and ``fn`` goes
to them pickled by value (cloudpickle), so a function from a script without a main
guard, a notebook, stdin or a closure works. ``submit`` cuts a batch's rows into chunks,
writes their rows into a shared-memory input block (``put_rows``) and sends each chunk's
small task to the worker with the fewest in hand; it returns at once. ``collect`` waits for
one batch and copies its rows out of their slot; ``release`` drops a batch never to be
collected (its slot is reused once its chunks are done). Several threads may submit
and collect at once: whichever waits reads the workers' replies for all of them.

A worker's exception, or its death (its reply pipe ends), becomes an error within a
poll interval that names the example it was transforming and the worker's last line on
stderr (the pool copies the workers' stderr through to this process's and keeps the
tail); the pool then stops its other workers and unlinks its shared memory, as it does
on close and at exit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import pickle
import select
import selectors
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Mapping
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from meshfeed.workers._bare import bare_argv
from meshfeed.workers._record_rows import RecordFn, chunks
from meshfeed.workers._shm import PoolBlocks, Spec, prepare_rows, put_rows
from meshfeed.workers._worker_loop import IDS, STATUS_STRIDE

_POLL_S = 0.05
_PIPE_BYTES = 1 << 20  # room for every task in flight, so a send never waits
_TAIL_BYTES = 8192


def send_by_value(fn: Any) -> bytes:
    """``fn`` pickled by value where it must be (cloudpickle); raises if it cannot be."""
    import cloudpickle

    return cloudpickle.dumps(fn)


@dataclasses.dataclass(eq=False)
class _Worker:
    index: int
    popen: subprocess.Popen[bytes]
    tasks: Connection
    results: Connection
    in_hand: dict[int, np.ndarray] = dataclasses.field(default_factory=dict)  # token -> ids
    tail: bytes = b""
    stderr_closed: threading.Event = dataclasses.field(default_factory=threading.Event)

    def last_error_line(self) -> str:
        """The worker's last line on stderr (a crash's "Fatal Python error" line, if any)."""
        self.stderr_closed.wait(0.5)
        lines = [line.strip() for line in self.tail.decode(errors="replace").splitlines()]
        lines = [line for line in lines if line]
        fatal = [line for line in lines if line.startswith("Fatal Python error")]
        return (fatal or lines or [""])[-1]


@dataclasses.dataclass
class Ticket:
    """One submitted batch: its output slot, its input block and its chunks in flight."""

    slot: int
    block: int
    rows: int
    spec: dict[str, Any]
    chunks: list[int]  # tokens


def _pipe() -> tuple[int, int]:
    r, w = os.pipe()
    with contextlib.suppress(OSError, AttributeError):  # Linux only; a default pipe works
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)  # type: ignore[attr-defined]
    return r, w


def _launch(index: int, status: str) -> _Worker:
    task_r, task_w = _pipe()
    result_r, result_w = _pipe()
    argv = bare_argv(
        "meshfeed.workers._worker_loop", str(task_r), str(result_w), status, str(index)
    )
    try:
        popen = subprocess.Popen(
            argv, pass_fds=(task_r, result_w), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
    finally:
        os.close(task_r)
        os.close(result_w)
    return _Worker(index, popen, Connection(task_w, readable=False), Connection(result_r))


def death_message(worker: _Worker, example: int) -> str:
    """What to say of a worker whose pipe ended, ``example`` the one it was on."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        worker.popen.wait(timeout=1.0)
    code = worker.popen.returncode
    if code is None:
        how = "closed its pipe"
    elif code < 0:
        how = f"was killed by {signal.Signals(-code).name}"
    else:
        how = f"exited with code {code}"
    doing = f"while transforming example {example}" if worker.in_hand else "while idle"
    line = worker.last_error_line()
    cause = f"; its last line on stderr: {line!r}" if line else ""
    return (
        f"record_transform worker {worker.index} (pid {worker.popen.pid}) {how} {doing}"
        f"{cause}. The loader stopped its other workers."
    )


def _copy_stderr(workers: list[_Worker]) -> None:
    """Copies the workers' stderr to this process's and keeps each one's tail."""
    selector = selectors.DefaultSelector()
    for w in workers:
        assert w.popen.stderr is not None
        selector.register(w.popen.stderr, selectors.EVENT_READ, w)
    while selector.get_map():
        for key, _ in selector.select():
            worker: _Worker = key.data
            data = os.read(key.fd, 65536)
            if not data:
                selector.unregister(key.fileobj)
                key.fileobj.close()  # type: ignore[union-attr]
                worker.stderr_closed.set()
                continue
            worker.tail = (worker.tail + data)[-_TAIL_BYTES:]
            with contextlib.suppress(OSError):
                os.write(2, data)
    selector.close()


class WorkerPool:
    """W worker processes that run ``fn`` on chunks of rows into shared-memory slots
    (``read_ahead``: the most steps and bytes the loader's read-ahead holds; ``PoolBlocks``)."""

    def __init__(
        self,
        fn: RecordFn,
        num_workers: int,
        *,
        read_ahead: tuple[int, int] = (1, 1),
        skip: bool = False,
        timeout_s: float = 600.0,
    ) -> None:
        payload = pickle.dumps((list(sys.path), send_by_value(fn), skip))
        self.num_workers, self.timeout_s = num_workers, timeout_s
        self._blocks = PoolBlocks(STATUS_STRIDE * num_workers, read_ahead)
        self._slots, self._inputs = self._blocks.slots, self._blocks.inputs
        self._workers = [_launch(i, self._blocks.status.name) for i in range(num_workers)]
        # Also at exit (weakref.finalize runs then); no atexit hook, which would keep the
        # pool alive after its loader is gone.
        self._finalizer = weakref.finalize(self, WorkerPool._shutdown, self._workers, self._blocks)
        for w in self._workers:
            w.tasks.send_bytes(payload)
        threading.Thread(
            target=_copy_stderr, args=(self._workers,), name="meshfeed-worker-stderr", daemon=True
        ).start()
        self._by_fd = {w.results.fileno(): w for w in self._workers}
        self._poller = select.poll()  # registered once: wait() would build a selector a call
        for fd in self._by_fd:
            self._poller.register(fd, select.POLLIN)
        self._cond = threading.Condition()
        self._done: dict[int, list[tuple[int, int, str]]] = {}  # token -> records skipped
        self._released: list[Ticket] = []  # dropped, their chunks not all done yet
        self._failure: str | None = None
        self._receiving = False
        self._heard = time.monotonic()
        self._token, self.busy_s = 0, 0.0  # busy_s: seconds on chunks, as replies say

    def submit(
        self, batch: Mapping[str, np.ndarray], ids: np.ndarray, spec: Spec, seed: int, epoch: int
    ) -> Ticket:
        """Queues ``batch``'s rows (example ids ``ids``) for the workers; returns at once."""
        rows, spec = len(ids), dict(spec)
        # One chunk a worker: the steps read ahead keep every worker's queue full.
        bounds = chunks(rows, self.num_workers)
        parts = [
            prepare_rows({**{k: v[lo:hi] for k, v in batch.items()}, IDS: ids[lo:hi]})
            for lo, hi in bounds
        ]
        size = sum(size for _, size in parts)
        with self._cond:
            self._raise_if_failed()
            self._blocks.plan(spec, rows, size)  # the first rows: what fits, and where
            ticket = Ticket(self._slots.take(spec, rows), self._inputs.take(size), rows, spec, [])
            inputs, slot = self._inputs.name(ticket.block), self._slots.name(ticket.slot)
            buffer, at = self._inputs.buffer(ticket.block), 0
            for (prepared, _), (lo, hi) in zip(parts, bounds, strict=True):
                layout, at = put_rows(buffer, at, prepared)
                self._token += 1
                worker = min(self._workers, key=lambda w: len(w.in_hand))
                worker.in_hand[self._token] = ids[lo:hi]
                task = (self._token, inputs, layout, slot, rows, spec, lo, seed, epoch)
                try:
                    worker.tasks.send_bytes(pickle.dumps(task))
                except OSError:  # the worker died before the pool read its reply pipe end
                    self._fail(self._died(worker))
                    self._raise_if_failed()
                ticket.chunks.append(self._token)
            del buffer
        return ticket

    def collect(self, ticket: Ticket) -> tuple[dict[str, np.ndarray], list[tuple[int, int, str]]]:
        """Waits for ``ticket``'s rows; returns copies of them, and the records skipped."""
        skipped = self._wait(ticket)
        out = self._slots.copy_out(ticket.slot, ticket.spec, ticket.rows)
        with self._cond:
            self._give_back(ticket)
        return out, skipped

    def release(self, ticket: Ticket) -> None:
        """Drops ``ticket``'s batch: its slot and block are reused once its chunks are done
        (a worker may still be writing into the slot)."""
        with self._cond:
            self._released.append(ticket)
            self._give_back_released()

    def _give_back(self, ticket: Ticket) -> None:
        self._slots.give_back(ticket.slot, ticket.spec, ticket.rows)
        self._inputs.give_back(ticket.block)

    def _give_back_released(self) -> None:
        for ticket in list(self._released):
            if all(token in self._done for token in ticket.chunks):
                for token in ticket.chunks:
                    del self._done[token]
                self._released.remove(ticket)
                self._give_back(ticket)

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise RuntimeError(self._failure)

    def _wait(self, ticket: Ticket) -> list[tuple[int, int, str]]:
        with self._cond:
            while True:
                self._raise_if_failed()
                if all(token in self._done for token in ticket.chunks):
                    return [s for token in ticket.chunks for s in self._done.pop(token)]
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
        heard, timeout_ms = False, 1000 * _POLL_S
        while True:
            try:
                ready = [self._by_fd[fd] for fd, _ in self._poller.poll(timeout_ms)]
            except (OSError, ValueError, KeyError):  # closed under us
                ready = []
            if not ready:
                break
            heard, timeout_ms = True, 0  # then whatever else is there, without waiting
            for worker in ready:
                try:
                    self._handle(worker, pickle.loads(worker.results.recv_bytes()))
                except (EOFError, OSError):
                    if self._failure is None:  # not a pipe this pool closed itself
                        self._fail(self._died(worker))
                if self._failure is not None:
                    return
        if heard:
            self._heard = time.monotonic()
        elif time.monotonic() - self._heard > self.timeout_s:
            self._fail(f"record_transform workers sent nothing for {self.timeout_s} s.")

    def _handle(self, worker: _Worker, reply: tuple[Any, ...]) -> None:
        token, error, *rest = reply  # then the records skipped, the seconds
        if token == "start":
            line = error.strip().splitlines()[-1]
            self._fail(f"record_transform worker {worker.index} could not start: {line}\n{error}")
            return
        worker.in_hand.pop(token, None)
        if error is not None:
            example_id, trace = error
            return self._fail(f"record_transform raised on example {example_id} in a worker "
                              f"process:\n{trace}")  # fmt: skip
        with self._cond:
            self._done[token] = rest[0]
            self.busy_s += rest[1]
            if self._released:
                self._give_back_released()

    def _died(self, worker: _Worker) -> str:
        return death_message(worker, self._blocks.example_in_hand(worker.index, STATUS_STRIDE))

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
    def steps_ahead(self) -> int | None:
        """The most steps /dev/shm lets the read-ahead hold (``None``: no bound)."""
        return self._blocks.steps_ahead

    @staticmethod
    def _shutdown(workers: list[_Worker], blocks: PoolBlocks) -> None:
        for w in workers:
            with contextlib.suppress(OSError):  # a full or broken pipe: the kill below
                w.tasks.send_bytes(pickle.dumps(None))
            w.tasks.close()
        deadline = time.monotonic() + 1.0
        for w in workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            if w.popen.poll() is None:
                w.popen.kill()
                w.popen.wait()
            w.results.close()
        blocks.close()
