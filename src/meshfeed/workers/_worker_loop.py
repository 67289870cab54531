"""What a record worker process runs: chunks of rows in, transformed rows out.

``_workers`` starts this with ``python -c``, not with ``multiprocessing``'s spawn, so
nothing of the user's script runs again in a worker (a script without the
``if __name__ == "__main__":`` guard, a notebook and stdin all work), and no process
that runs JAX is forked. The bootstrap makes ``meshfeed`` a bare package whose
``__init__`` runs only if the user's function reaches for ``meshfeed.<name>``, so a
worker starts with numpy and the few modules below, not JAX.

The first message is the parent's ``sys.path`` and the function, pickled by value
(cloudpickle); then each message names a chunk: the shared-memory block and the layout
of its rows there (``get_rows``), and the slot its output rows go to. The worker writes the id of
the example in hand to its cell of a shared status block, so its parent can name the
example if the worker dies. It ignores Ctrl-C (the parent stops it) and ends when its
parent closes the task pipe or is gone.
"""

from __future__ import annotations

import faulthandler
import pickle
import signal
import sys
import traceback
import types
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from meshfeed.workers._record_rows import EXAMPLE_ID, transform_rows
from meshfeed.workers._shm import Attached, attach, get_rows, views

IDS = "__meshfeed_ids__"  # the chunk's example ids, beside its fields in the input block
BOOT = (
    "import sys, types\n"
    "package = types.ModuleType('meshfeed')\n"
    "package.__path__ = [sys.argv[1]]\n"
    "sys.modules['meshfeed'] = package\n"
    "from meshfeed.workers._worker_loop import main\n"
    "main(package, *sys.argv[2:])\n"
)


def _load_on_use(package: types.ModuleType) -> None:
    """Runs the real ``meshfeed/__init__.py`` the first time a name of it is asked for."""

    def __getattr__(name: str) -> Any:
        vars(package).pop("__getattr__", None)
        init = Path(package.__path__[0]) / "__init__.py"
        exec(compile(init.read_text(), str(init), "exec"), vars(package))
        return getattr(package, name)

    package.__getattr__ = __getattr__  # type: ignore[attr-defined]


def _reply(results: Connection, message: Any) -> None:
    results.send_bytes(pickle.dumps(message))


def main(
    package: types.ModuleType, tasks_fd: str, results_fd: str, status: str, index: str
) -> None:
    """Serves chunks until the task pipe closes (see the module's docstring)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    faulthandler.enable()  # a crash in native code still leaves its trace on stderr
    _load_on_use(package)
    tasks = Connection(int(tasks_fd), writable=False)
    results = Connection(int(results_fd), readable=False)
    try:
        path, payload = pickle.loads(tasks.recv_bytes())
        sys.path[:0] = [p for p in path if p not in sys.path]
        fn = pickle.loads(payload)
    except BaseException:
        _reply(results, ("start", traceback.format_exc()))
        sys.exit(1)
    attached = Attached()
    status_map, _ = attach(status)  # kept apart: ``current`` lives as long as the worker
    current = np.ndarray((1,), np.int64, buffer=status_map, offset=8 * int(index))
    while True:
        try:
            task = pickle.loads(tasks.recv_bytes())
        except EOFError:  # the loading process is gone
            break
        if task is None:
            break
        token, inputs, layout, slot, rows, spec, start, seed, epoch = task
        ids = np.empty(0, np.int64)
        try:
            part = get_rows(attached[inputs], layout)
            ids = part.pop(IDS)
            outputs = views(attached[slot], spec, rows)
            transform_rows(fn, part, ids, outputs, start, seed, epoch, current)
            del outputs, part
            _reply(results, (token, None))
        except Exception as error:
            first = next((int(i) for i in ids if i >= 0), -1)
            _reply(results, (token, (getattr(error, EXAMPLE_ID, first), traceback.format_exc())))
    del current
    attached.close()
