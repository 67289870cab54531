"""What a record worker process runs: chunks of rows in, transformed rows out.

``_workers`` starts this in a bare meshfeed (``_bare``): nothing of the user's script
runs again, and JAX is not imported unless the user's function reaches for it.

The first message is the parent's ``sys.path`` and the function, pickled by value
(cloudpickle); then each message names a chunk: the shared-memory block and the layout
of its rows there (``get_rows``), and the slot its output rows go to. The worker writes
the id of the example in hand to its cell of a shared status block, so its parent can name the
example if the worker dies. It ignores Ctrl-C (the parent stops it) and ends when its
parent closes the task pipe or is gone (then removing the parent's files transport, if
it used one: a parent killed outright cannot).
"""

from __future__ import annotations

import faulthandler
import pickle
import signal
import sys
import time
import traceback
import types
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from meshfeed.workers._bare import load_on_use
from meshfeed.workers._blocks import attach, remove_folder
from meshfeed.workers._layouts import IDS, get_rows
from meshfeed.workers._record_errors import failure_of
from meshfeed.workers._record_rows import dropped, transform_rows
from meshfeed.workers._shm import Attached, views

STATUS_STRIDE = 64  # bytes between two workers' cells: a cache line, not shared between cores


def _reply(results: Connection, message: Any) -> None:
    results.send_bytes(pickle.dumps(message))


def main(
    package: types.ModuleType, tasks_fd: str, results_fd: str, status: str, index: str
) -> None:
    """Serves chunks until the task pipe closes (see the module's docstring)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    faulthandler.enable()  # a crash in native code still leaves its trace on stderr
    load_on_use(package)
    tasks = Connection(int(tasks_fd), writable=False)
    results = Connection(int(results_fd), readable=False)
    try:
        path, payload, skip = pickle.loads(tasks.recv_bytes())
        sys.path[:0] = [p for p in path if p not in sys.path]
        fn = pickle.loads(payload)
    except BaseException:
        _reply(results, ("start", traceback.format_exc()))
        sys.exit(1)
    attached = Attached()
    try:
        _serve(fn, skip, tasks, results, attached, status, int(index))
    except (EOFError, OSError):  # the loading process is gone without a word: killed, say
        for folder in attached.folders():  # its files transport, which nobody else would
            remove_folder(folder)  # remove
    attached.close()


def _serve(
    fn: Any,
    skip: bool,
    tasks: Connection,
    results: Connection,
    attached: Attached,
    status: str,
    index: int,
) -> None:
    """Transforms chunks until the parent says stop (``EOFError`` or ``OSError`` when it
    is gone); each reply is ``(token, None, records skipped or filtered (``dropped``),
    seconds)``, or ``(token, Failure, [])`` where the chunk raised."""
    attached[status]
    status_map, _ = attach(status)  # kept apart: ``current`` lives as long as the worker
    current = memoryview(status_map)[STATUS_STRIDE * index :][:8].cast("q")
    while True:
        task = pickle.loads(tasks.recv_bytes())
        if task is None:
            return
        token, inputs, layout, slot, rows, spec, start, seed, epoch = task
        ids = np.empty(0, np.int64)
        skipped: list[tuple[int, int, str]] | None = [] if skip else None
        filtered: list[tuple[int, int]] = []
        began = time.perf_counter()
        try:
            part = get_rows(attached[inputs], layout)
            ids = part.pop(IDS)
            outputs = views(attached[slot], spec, rows)
            transform_rows(fn, part, ids, outputs, start, seed, epoch, current, skipped, filtered)
            del outputs, part
            gone = dropped(skipped, filtered)
            reply: Any = (token, None, gone, time.perf_counter() - began)
        except Exception as error:  # named by the parent, which knows the source
            reply = (token, failure_of(error, ids, trace=True), [])
        _reply(results, reply)
