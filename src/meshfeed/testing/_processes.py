"""Running a function in real JAX processes on 127.0.0.1, as ``meshfeed launch`` runs a script."""

from __future__ import annotations

import os
import pickle
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meshfeed.cluster._env import ENV_PROCESS_ID
from meshfeed.cluster._initialize import initialize
from meshfeed.cluster._launch import process_env, python_argv, start_processes, supervise
from meshfeed.cluster._watch import watching
from meshfeed.workers._processes import send_by_value


def cluster_env(
    process_id: int, num_processes: int, devices_per_process: int, coordinator: str
) -> dict[str, str]:
    """This process's environment plus what ``meshfeed.initialize()`` reads to join a
    job (coordinator, process count and id, CPU devices), as a cluster manager gives
    it: for starting the processes of a job yourself, without ``meshfeed launch``.
    ``coordinator`` is ``"127.0.0.1:<port>"``, the same for every process (``free_port``).
    """
    return process_env(process_id, num_processes, devices_per_process, coordinator)


_ENV_PAYLOAD = "MESHFEED_TEST_PAYLOAD"
_ENV_OUT = "MESHFEED_TEST_OUT"


class ProcessFailedError(RuntimeError):
    """A process started by ``run_in_processes`` failed; the message holds its traceback."""


def run_in_processes(
    fn: Callable[..., Any],
    *args: Any,
    num_processes: int = 2,
    devices_per_process: int = 4,
    timeout_s: float = 300.0,
) -> list[Any]:
    """Runs ``fn(*args)`` in ``num_processes`` connected JAX processes.

    Each process has ``devices_per_process`` CPU devices and has called
    ``meshfeed.initialize()`` before ``fn`` runs. ``fn`` and ``args`` go to the processes
    by value where they must (cloudpickle), so ``fn`` may be defined anywhere: a module, a
    script with or without a main guard, a notebook, a closure. Its result must be
    picklable (numpy, not ``jax.Array``).

    Returns:
      Each process's result, in process order.

    Raises:
      ProcessFailedError: a process raised or died; the others are stopped at once and
        the message holds that process's traceback.
      TimeoutError: the processes ran past ``timeout_s``.
    """
    with tempfile.TemporaryDirectory(prefix="meshfeed-test-") as tmp:
        out = Path(tmp)
        with (out / "payload.pkl").open("wb") as f:
            pickle.dump(list(sys.path), f)
            f.write(send_by_value((fn, args)))
        children = start_processes(
            python_argv("from meshfeed.testing._processes import child_main; child_main()"),
            num_processes=num_processes,
            devices_per_process=devices_per_process,
            log_dir=out,
            extra_env={_ENV_PAYLOAD: str(out / "payload.pkl"), _ENV_OUT: tmp},
        )
        failed, timed_out = supervise(children, timeout_s=timeout_s)
        if failed is not None:
            # Report every process that wrote an error: the first to die is not always
            # the first one noticed (a peer's collective fails once it is gone).
            reports = []
            for child in children:
                error = out / f"error_{child.process_id}.txt"
                if error.exists():
                    reports.append(f"--- process {child.process_id}:\n{error.read_text()}")
            if not reports:
                reports.append(f"--- process {failed.process_id}:\n{failed.output_tail()}")
            raise ProcessFailedError(
                f"process {failed.process_id} of {num_processes} failed "
                f"(exit code {failed.popen.returncode}):\n" + "\n".join(reports)
            )
        if timed_out:
            logs = "\n".join(f"--- process {c.process_id}:\n{c.output_tail()}" for c in children)
            raise TimeoutError(f"processes still running after {timeout_s} s:\n{logs}")
        results = []
        for child in children:
            with (out / f"result_{child.process_id}.pkl").open("rb") as f:
                results.append(pickle.load(f))
        return results


def child_main() -> None:
    """Entry point of a process started by ``run_in_processes`` (not for direct use)."""
    out = Path(os.environ[_ENV_OUT])
    process_id = int(os.environ[ENV_PROCESS_ID])
    try:
        with Path(os.environ[_ENV_PAYLOAD]).open("rb") as f:
            sys.path[:0] = [p for p in pickle.load(f) if p not in sys.path]
            fn, args = pickle.load(f)
        initialize()
        result = fn(*args)
        with (out / f"result_{process_id}.pkl").open("wb") as f:
            pickle.dump(result, f)
    except BaseException as error:
        (out / f"error_{process_id}.txt").write_text(traceback.format_exc())
        sys.stderr.flush()
        watch = watching()
        if watch is not None:  # the other processes hear why, and end at once
            watch.fail(f"{type(error).__name__}: {error}")
        # Skip atexit: jax.distributed's shutdown barrier would wait for peers forever.
        os._exit(1)
