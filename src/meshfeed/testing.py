"""Helpers for testing code that runs on many processes and devices.

``run_in_processes`` runs a function in N real JAX processes on 127.0.0.1 (gloo
collectives, CPU devices), the way ``meshfeed launch`` runs a script, and returns what
each returned. ``assert_resumes_identically`` restores a loader at every step of a
short stream and compares the rest with the uninterrupted stream. ``S3Server`` runs an
S3-compatible server on 127.0.0.1 (moto, from the ``dev`` extra), and ``Proxy`` takes it
away and brings it back.
"""

from __future__ import annotations

import os
import pickle
import sys
import tempfile
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from meshfeed._env import ENV_PROCESS_ID
from meshfeed._initialize import initialize
from meshfeed._launch import free_port, process_env, python_argv, start_processes, supervise
from meshfeed._s3_server import Proxy, S3Server
from meshfeed._watch import watching
from meshfeed._workers import send_by_value

__all__ = [
    "ProcessFailedError",
    "Proxy",
    "S3Server",
    "assert_resumes_identically",
    "cluster_env",
    "free_port",
    "local_shards",
    "run_in_processes",
]


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
            python_argv("from meshfeed.testing import child_main; child_main()"),
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


def local_shards(x: jax.Array) -> list[tuple[tuple[slice, ...], np.ndarray]]:
    """This process's shards of ``x`` as (global index, numpy data), by device id."""
    shards = sorted(x.addressable_shards, key=lambda s: s.device.id)
    return [(s.index, np.asarray(s.data)) for s in shards]


def assert_resumes_identically(
    make_loader: Callable[[], Any], *, max_steps: int | None = None
) -> int:
    """Restores a fresh loader at every step and checks it yields the same remaining batches.

    ``make_loader()`` must build the same loader each call. Compares this process's
    shards, so it holds on every process of a multi-process run.

    Returns:
      The number of steps checked.
    """
    reference = make_loader()
    states: list[Mapping[str, Any]] = []
    stream: list[dict[str, list[tuple[tuple[slice, ...], np.ndarray]]]] = []
    for batch in reference:
        stream.append({k: local_shards(v) for k, v in batch.items()})
        states.append(reference.state())
        if max_steps is not None and len(stream) >= max_steps:
            break
    starts = [None, *states[:-1]]
    for k, state in enumerate(starts):
        loader = make_loader()
        if state is not None:
            loader.restore(state)
        for j, batch in enumerate(loader, start=k):
            if j >= len(stream):
                break
            for name, shards in stream[j].items():
                got = local_shards(batch[name])
                for (index, want), (got_index, have) in zip(shards, got, strict=True):
                    if index != got_index or not np.array_equal(want, have):
                        raise AssertionError(
                            f"restored at step {k}, step {j} field {name!r} differs from "
                            "the uninterrupted stream."
                        )
    return len(stream)
