"""Running a build's parts: local worker processes or Ray tasks, with progress.

``run_local`` drives processes started in a bare meshfeed (``_worker``) and hands each
the next part as soon as it finishes one, so a slow part does not hold the others up;
the parts' contents do not depend on which worker wrote them. For ``select`` the calling
process writes parts too, and the workers may rest for the next job instead of ending.
``run_ray`` submits one Ray task per part to the cluster ``ray.init()`` connects to (a
local one if none is running), each with ``threads`` CPUs and its tokenizer's thread
pool set to match.
Both stop at the first error: the other workers are stopped, and the parts they had not
finished stay unwritten (no manifest), so a re-run redoes just those.

``Report`` shows progress on process-wide figures -- parts, documents, tokens/s -- as a
bar on a terminal and as a line per finished part off one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from meshfeed.prepare._read import BadInput
from meshfeed.workers._bare import bare_argv


class Report:
    """Progress of one run: its parts, documents and tokens so far."""

    NAME = "prepare"
    COUNTS: tuple[str, ...] = ("documents", "tokens", "empty", "skipped")

    def __init__(self, total: int, *, show: bool) -> None:
        self.total = total
        self.parts = 0
        self.counts = dict.fromkeys(self.COUNTS, 0)
        self._live: dict[int, tuple[int, int]] = {}  # part -> (documents, tokens) so far
        self.start = time.perf_counter()
        self._console = Console(file=sys.stderr)
        self._show = show
        self._bar = Progress(
            TextColumn(f"[bold]{self.NAME}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("parts  {task.fields[info]}"),
            TimeElapsedColumn(),
            console=self._console,
            disable=not (show and self._console.is_terminal),
        )
        self._task = self._bar.add_task(self.NAME, total=total, info="")

    def __enter__(self) -> Report:
        self._bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._bar.__exit__(*exc)

    def progress(self, part: int, documents: int, tokens: int) -> None:
        self._live[part] = (documents, tokens)
        self._bar.update(self._task, info=self._info())

    def done(self, part: int, counts: dict[str, int]) -> None:
        self._live.pop(part, None)
        self.parts += 1
        for key in self.counts:
            self.counts[key] += counts.get(key, 0)
        self._bar.update(self._task, completed=self.parts, info=self._info())
        if self._show and not self._console.is_terminal:
            print(
                f"{self.NAME}: part {part} written ({self.parts}/{self.total})  {self._info()}",
                file=sys.stderr,
                flush=True,
            )

    def _info(self) -> str:
        documents = self.counts["documents"] + sum(d for d, _ in self._live.values())
        tokens = self.counts["tokens"] + sum(t for _, t in self._live.values())
        rate = tokens / max(1e-9, time.perf_counter() - self.start)
        return f"{documents:,} documents  {tokens:,} tokens  {rate:,.0f} tokens/s"


@dataclasses.dataclass(eq=False)
class _Worker:
    popen: subprocess.Popen[bytes]
    tasks: Connection
    results: Connection
    parts: deque[int] = dataclasses.field(default_factory=deque)  # sent, not finished
    ready: bool = False  # has its plan, serves parts
    ended: bool = False  # has nothing more to do in this job


def start_workers(count: int, kind: str = "prepare") -> list[_Worker]:
    """``count`` worker processes, started now: they import what they need while the
    caller plans the build, and wait for ``run_local`` to send them the plan. ``kind``:
    what they run (``_worker``: ``"prepare"`` or ``"select"``)."""
    workers = []
    for _ in range(count):
        task_r, task_w = os.pipe()
        result_r, result_w = os.pipe()
        argv = bare_argv("meshfeed.prepare._worker", str(task_r), str(result_w), kind)
        try:
            popen = subprocess.Popen(argv, pass_fds=(task_r, result_w), stdin=subprocess.DEVNULL)
        finally:
            os.close(task_r)
            os.close(result_w)
        tasks = Connection(task_w, readable=False)
        workers.append(_Worker(popen, tasks, Connection(result_r, writable=False)))
    return workers


def run_local(
    pool: list[_Worker],
    parts: list[int],
    init: dict[str, Any],
    report: Report,
    here: Callable[[int], dict[str, int]] | None = None,
    keep: bool = False,
) -> None:
    """Writes ``parts`` with the started ``pool`` (the module docstring), then stops the
    pool -- or, with ``keep``, leaves each worker that started resting for the next job
    (one still starting is stopped; on an error every worker is).

    ``here(index) -> counts``: this process writes parts too, one at a time between
    handing parts out, from the start (while the workers import) to the end; each
    worker then holds its next part queued, so none waits while this process is busy
    with one of its own.
    """
    todo = deque(parts)
    for worker in pool:
        worker.parts.clear()
        worker.ready = worker.ended = False
    done = False
    try:
        plan = pickle.dumps(init)
        for worker in pool:
            worker.tasks.send(plan)
        while todo or any(w.parts for w in pool):
            live = [w for w in pool if not w.ended]
            if not live and here is None:
                raise RuntimeError("run_local has parts to write and no worker to write them")
            mine = here is not None and bool(todo)
            by_pipe = {w.results: w for w in live}
            for connection in wait(list(by_pipe), 0 if mine else None):
                _receive(by_pipe[connection], report)  # type: ignore[index]
            _hand_out(live, todo, queued=2 if here is not None else 1)
            if here is not None and todo:
                index = todo.popleft()
                report.done(index, here(index))
        done = True
    finally:
        if done and keep:
            for worker in pool:
                worker.tasks.send("rest")
            stop_workers([w for w in pool if not w.ready])
        else:
            stop_workers(pool)


def _receive(worker: _Worker, report: Report) -> None:
    """One message from ``worker``: ready, a part's progress, done or error."""
    try:
        message = worker.results.recv()
    except EOFError:
        code = worker.popen.wait()
        worker.ended = True
        if not worker.ready:
            raise RuntimeError(
                f"a worker (pid {worker.popen.pid}) exited with code {code} while starting; "
                "its stderr is above."
            ) from None
        raise RuntimeError(
            f"a worker (pid {worker.popen.pid}) exited with code {code} while writing part "
            f"{worker.parts[0] if worker.parts else None}; its stderr is above. The parts "
            "written so far are kept: run the same command again to go on."
        ) from None
    if message[0] == "ready":
        worker.ready = True
        return
    if message[0] == "error" and message[1] is None:
        raise RuntimeError(f"a worker could not start:\n{message[2]}")
    _handle(message, report)
    if message[0] == "done":
        worker.parts.popleft()


def _hand_out(live: list[_Worker], todo: deque[int], queued: int) -> None:
    """Each ready worker its next parts: up to ``queued`` while more parts are left than
    workers, else one; a worker with none left is done with this job."""
    for worker in live:
        if not worker.ready:
            continue
        want = queued if len(todo) > len(live) else 1
        while todo and len(worker.parts) < want:
            worker.parts.append(todo.popleft())
            worker.tasks.send(worker.parts[-1])
        worker.ended = not todo and not worker.parts


def stop_workers(pool: list[_Worker]) -> None:
    """Ends the workers: idle ones when their task pipe closes; busy ones and ones still
    starting are killed."""
    for worker in pool:
        with contextlib.suppress(OSError):
            worker.tasks.close()
        if worker.parts or not worker.ready:  # mid-part: nothing of it counts
            worker.popen.kill()
    for worker in pool:
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.popen.wait(timeout=10)
        if worker.popen.poll() is None:
            worker.popen.kill()
            worker.popen.wait()


def _handle(message: tuple[Any, ...], report: Report) -> None:
    kind = message[0]
    if kind == "progress":
        report.progress(*message[1:])
    elif kind == "done":
        report.done(message[1], message[2])
    elif kind == "error":
        raise BadInput(message[2])


def run_ray(
    parts: list[int], init: dict[str, Any], threads: int, report: Report, task: Any = None
) -> None:
    """Writes ``parts`` as Ray tasks (the module docstring); ``task(init, index)`` runs
    one part (``ray_part``, a prepare part, by default)."""
    try:
        import ray
    except ImportError:
        raise ImportError(
            "executor='ray' needs Ray: pip install 'meshfeed[ray]' (from a clone: pip "
            "install -e '.[ray]')."
        ) from None
    if not ray.is_initialized():
        ray.init(log_to_driver=False)
    env = {"RAYON_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "true"}
    remote = ray.remote(num_cpus=threads, max_retries=0, runtime_env={"env_vars": env})
    task = remote(task or ray_part)
    shared = ray.put(init)
    pending = {task.remote(shared, i): i for i in parts}
    try:
        while pending:
            finished, _ = ray.wait(list(pending), num_returns=1)
            pending.pop(finished[0])
            _handle(ray.get(finished[0]), report)
    finally:
        for ref in pending:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)


_RUNNERS: dict[int, Any] = {}


def ray_part(init: dict[str, Any], index: int) -> tuple[Any, ...]:
    """One part, in a Ray worker (which keeps its encoder for the next part)."""
    from meshfeed.prepare._worker import Runner

    key = hash(pickle.dumps((init["out"], init["tokenizer"])))
    if key not in _RUNNERS:
        _RUNNERS.clear()
        _RUNNERS[key] = Runner(init)
    return _RUNNERS[key](index)
