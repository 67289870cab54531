"""Worker processes: started bare with ``python -c``, their stderr copied, their deaths told.

A worker is a process that runs ``_worker_loop`` in a bare meshfeed (``_bare``: no JAX,
nothing of the user's script), fed by a task pipe and answering on a reply pipe, both
sized so a send never waits. ``launch`` starts one; ``copy_stderr`` copies every
worker's stderr through to this process's and keeps each one's tail, so that
``death_message`` can say how a worker ended (a signal, an exit code, a closed pipe),
what it was doing, and its last line (a crash's "Fatal Python error" first).
``send_by_value`` pickles what goes to a worker by value (cloudpickle), so a function
from a script without a main guard, a notebook, stdin or a closure works. ``Crew`` is
one pool's workers: tasks out to the one with the fewest in hand, replies in as they
come; ``stop`` ends them (asked first, killed after a second).
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
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from meshfeed.workers._bare import bare_argv
from meshfeed.workers._record_errors import ExampleNames

_PIPE_BYTES = 1 << 20  # room for every task in flight, so a send never waits
_TAIL_BYTES = 8192


def send_by_value(fn: Any) -> bytes:
    """``fn`` pickled by value where it must be (cloudpickle); raises if it cannot be."""
    import cloudpickle

    return cloudpickle.dumps(fn)


@dataclasses.dataclass(eq=False)
class WorkerProcess:
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


def pipe() -> tuple[int, int]:
    r, w = os.pipe()
    with contextlib.suppress(OSError, AttributeError):  # Linux only; a default pipe works
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)  # type: ignore[attr-defined]
    return r, w


def launch(index: int, status: str) -> WorkerProcess:
    task_r, task_w = pipe()
    result_r, result_w = pipe()
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
    return WorkerProcess(index, popen, Connection(task_w, readable=False), Connection(result_r))


def death_message(worker: WorkerProcess, example: str) -> str:
    """What to say of a worker whose pipe ended, ``example`` the one it was on (named:
    ``example 17 (/data/b.jpg)``)."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        worker.popen.wait(timeout=1.0)
    code = worker.popen.returncode
    if code is None:
        how = "closed its pipe"
    elif code < 0:
        how = f"was killed by {signal.Signals(-code).name}"
    else:
        how = f"exited with code {code}"
    doing = f"while transforming {example}" if worker.in_hand else "while idle"
    line = worker.last_error_line()
    cause = f"; its last line on stderr: {line!r}" if line else ""
    return (
        f"record_transform worker {worker.index} (pid {worker.popen.pid}) {how} {doing}"
        f"{cause}. The loader stopped its other workers."
    )


def copy_stderr(workers: list[WorkerProcess]) -> None:
    """Copies the workers' stderr to this process's and keeps each one's tail."""
    selector = selectors.DefaultSelector()
    for w in workers:
        assert w.popen.stderr is not None
        selector.register(w.popen.stderr, selectors.EVENT_READ, w)
    while selector.get_map():
        for key, _ in selector.select():
            worker: WorkerProcess = key.data
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


class Crew:
    """The worker processes of one pool: started, each sent the pool's ``payload`` first,
    then tasks (``send``), their replies read as they come (``replies``), their deaths
    told (``death``). ``names`` names the examples of their errors; ``in_hand(i)`` is
    the example worker ``i`` is on (its cell of the ``status`` block)."""

    def __init__(
        self,
        count: int,
        status: str,
        payload: bytes,
        names: ExampleNames | None,
        in_hand: Callable[[int], int],
    ) -> None:
        self.workers = [launch(i, status) for i in range(count)]
        self._names = names or ExampleNames()
        self._in_hand = in_hand
        for worker in self.workers:
            worker.tasks.send_bytes(payload)
        threading.Thread(
            target=copy_stderr, args=(self.workers,), name="meshfeed-worker-stderr", daemon=True
        ).start()
        self._by_fd = {w.results.fileno(): w for w in self.workers}
        self._poller = select.poll()  # registered once: wait() would build a selector a call
        for fd in self._by_fd:
            self._poller.register(fd, select.POLLIN)

    def send(self, token: int, task: Any, ids: np.ndarray) -> WorkerProcess | None:
        """Sends ``task`` (example ids ``ids``) to the worker with the fewest in hand;
        returns that worker if its pipe is broken (it died), else ``None``."""
        worker = min(self.workers, key=lambda w: len(w.in_hand))
        worker.in_hand[token] = ids
        try:
            worker.tasks.send_bytes(pickle.dumps(task))
        except OSError:  # the worker died before the pool read its reply pipe end
            return worker
        return None

    def replies(self, timeout_s: float) -> Iterator[tuple[WorkerProcess, int | None, Any]]:
        """What comes back within ``timeout_s``, then whatever else is there without
        waiting: ``(worker, token, (records skipped, seconds))`` for a chunk done;
        ``(worker, None, message)`` for a failure -- its transform raised, it could not
        start -- or ``(worker, None, None)`` where its pipe ended (``death_message``)."""
        timeout_ms = 1000 * timeout_s
        while True:
            try:
                ready = [self._by_fd[fd] for fd, _ in self._poller.poll(timeout_ms)]
            except (OSError, ValueError, KeyError):  # closed under us
                return
            if not ready:
                return
            timeout_ms = 0
            for worker in ready:
                try:
                    token, error, *rest = pickle.loads(worker.results.recv_bytes())
                except (EOFError, OSError):
                    yield worker, None, None
                    continue
                if token == "start":
                    line = error.strip().splitlines()[-1]
                    why = f"record_transform worker {worker.index} could not start: {line}"
                    yield worker, None, f"{why}\n{error}"
                    continue
                worker.in_hand.pop(token, None)
                if error is not None:  # a Failure: the example named, as anywhere
                    yield worker, None, error.message("in a worker process", self._names)
                    continue
                yield worker, token, (rest[0], rest[1])

    def death(self, worker: WorkerProcess) -> str:
        """What to say of ``worker``, whose pipe ended (``death_message``)."""
        return death_message(worker, self._names(self._in_hand(worker.index)))

    def idle(self) -> bool:
        """Whether some worker has nothing in hand."""
        return any(not w.in_hand for w in self.workers)


def stop(workers: list[WorkerProcess]) -> None:
    """Asks the workers to end, waits up to 1 s, then kills those left."""
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
