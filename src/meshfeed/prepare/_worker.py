"""What a ``prepare``, ``select`` or ``shard_images`` worker process runs: parts in and out.

Started in a bare meshfeed (``workers._bare``: no JAX, nothing of the user's script).
A job's first message holds its plan (bytes), the tokenizer's payload and how many threads
its Rust pool may use -- set in the environment before ``tokenizers`` first runs, which
is what a forked ``multiprocessing`` worker gets wrong: ``tokenizers`` turns its
parallelism off in a forked child, silently. Each later message is a part to write; the
worker answers with progress now and then, and with the part's counts when its
manifest is written, or with the error that stopped it. A ``select`` worker may serve
job after job (``"rest"`` between them drops the last one's source and predicate). It
ignores Ctrl-C (its parent stops it) and ends when the task pipe closes.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
import traceback
import types
from multiprocessing.connection import Connection
from typing import Any, NoReturn

from meshfeed.workers._bare import load_on_use


def main(package: types.ModuleType, tasks_fd: str, results_fd: str, kind: str = "prepare") -> None:
    """Serves parts until the task pipe closes (the module docstring); ``kind``:
    ``"prepare"`` (``Runner``), ``"chat"`` (``Runner``, with ``transformers`` imported
    while the parent loads the tokenizer, off its core), ``"chat-given"`` (the same, on
    every core: the parent was given the tokenizer loaded), ``"select"``
    (``SelectRunner``) or ``"images"`` (``ImagesRunner``, for ``shard_images``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    load_on_use(package)
    cores = _spare_the_parents_core() if kind == "chat" else None
    if kind == "select":  # a select worker imports no tokenizer, no writer
        from meshfeed.prepare._select_part import SelectRunner as make
    elif kind == "images":  # an image shard worker: no tokenizer
        from meshfeed.prepare._image_part import ImagesRunner as make
    else:
        make = Runner
        import meshfeed.data._tokenizer  # while the parent plans, not after
        import meshfeed.prepare._encode  # noqa: F401

        with contextlib.suppress(ImportError):
            import tokenizers  # noqa: F401
        if kind in ("chat", "chat-given"):
            from meshfeed.prepare._chat import preload

            preload()
    if cores is not None:  # booted: every core again
        os.sched_setaffinity(0, cores)
    tasks = Connection(int(tasks_fd), writable=False)
    results = Connection(int(results_fd), readable=False)
    run: Any = None
    while True:
        try:
            message = tasks.recv()
        except EOFError:
            message = None
        if message is None:  # done: every answer is sent, nothing is left to tear down
            _leave()
        if message == "rest":  # between jobs: nothing of the last one kept
            run = None
        elif isinstance(message, bytes):  # a job's plan: answered "ready"
            run = _start(make, message, results)
        else:
            index = message
            progress = lambda d, t, i=index: results.send(("progress", i, d, t))  # noqa: E731
            results.send(run(index, progress))


def _leave() -> NoReturn:
    """Exits at once: tearing down an interpreter with ``transformers`` loaded takes
    ~0.2 s, which the parent, waiting for its workers to end, would add to every build."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _spare_the_parents_core() -> set[int] | None:
    """Boots off the first of this process's cores (the parent's, while it loads the
    tokenizer the workers wait for: ~1.5 s through ``AutoTokenizer``, which their own
    imports would otherwise slow by half on two cores); returns the cores to go back to
    (``None``: nothing changed, one core or no affinity here)."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cores = os.sched_getaffinity(0)
    if len(cores) < 2:
        return None
    os.sched_setaffinity(0, cores - {min(cores)})
    return cores


def _start(make: Any, plan: bytes, results: Connection) -> Any:
    """The runner for a job's ``plan`` (answers ``("ready",)``), or the process exits
    with the error sent."""
    try:
        init = pickle.loads(plan)
        sys.path[:0] = [p for p in init["path"] if p not in sys.path]
        run = make(init)
    except BaseException:
        results.send(("error", None, traceback.format_exc()))
        sys.exit(1)
    results.send(("ready",))
    return run


class Runner:
    """Writes parts with one encoder (built once per process, used for every part)."""

    def __init__(self, init: dict[str, Any]) -> None:
        from meshfeed.data._tokenizer import encoder

        self.plan = init["plan"]
        self.out = init["out"]
        self.storage_options = init["storage_options"]
        kind, payload = init["tokenizer"]
        if kind == "chat":  # conversations, through transformers
            from meshfeed.prepare._chat import chat_encoder

            self.encode: Any = chat_encoder(payload, threads=init["threads"])
        else:
            self.encode = encoder(kind, payload, threads=init["threads"])
        self.dataset = pickle.loads(init["dataset"]) if init["dataset"] is not None else None

    def __call__(self, index: int, progress: Any = None) -> tuple[Any, ...]:
        from meshfeed.prepare._encode import write_part
        from meshfeed.prepare._read import BadInput

        try:
            counts = write_part(
                index,
                self.plan,
                self.encode,
                self.out,
                storage_options=self.storage_options,
                dataset=self.dataset,
                progress=progress,
            )
        except BadInput as error:
            return ("error", index, str(error))
        except Exception as error:
            return ("error", index, f"{type(error).__name__}: {error}\n{traceback.format_exc()}")
        return ("done", index, counts)
