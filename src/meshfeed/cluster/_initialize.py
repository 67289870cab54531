"""Connecting the processes of a job, and watching them once connected.

``initialize`` is ``jax.distributed.initialize`` for meshfeed's situations -- started by
``meshfeed launch`` (or ``run_in_processes``), started by a cluster manager that JAX
detects, started with explicit arguments, or started alone -- with the same call in the
same script, and with a watch (``_watch``) that ends the job in seconds when a process
is lost. ``watch`` starts that watch for a job whose processes called
``jax.distributed.initialize`` themselves; the loader calls it when several processes
run and nothing watches them yet. ``shutdown`` is the way out for a process that ends
with ``os._exit``: JAX's shutdown barrier, then the watch's goodbye.

The watch's processes find each other through the connection JAX already has: process
0 opens the watch's port (any free one) and tells the others its addresses and port with
one broadcast (``multihost_utils.broadcast_one_to_all``), so there is no port to open
or name. (JAX's coordination service has a key-value store that would let processes
meet without a collective, but it is reachable only through JAX's private modules,
which meshfeed does not read.) Being a collective, the watch starts at the same point
on every process: in ``initialize``, or where every process builds its first loader.
"""

from __future__ import annotations

import inspect
import math
import os
import socket
import sys
import threading
from collections.abc import Sequence
from typing import Any

from meshfeed.cluster._env import (
    ENV_COORDINATOR,
    ENV_NUM_PROCESSES,
    ENV_PROCESS_ID,
    require_initialized,
)
from meshfeed.cluster._stall import STALL_S, check_stall_arguments, watch_alone
from meshfeed.cluster._watch import Watch, doing, now_doing, set_watch, watching

HEARTBEAT_TIMEOUT = 10.0
"""Seconds of silence after which a process is declared lost (see ``initialize``)."""

_initialized_by: dict[str, Any] | None = None  # the arguments of the call that connected


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    local_device_ids: int | Sequence[int] | None = None,
    *,
    heartbeat_timeout: float = HEARTBEAT_TIMEOUT,
    stall_s: float = STALL_S,
    on_stall: str = "log",
    **jax_kwargs: Any,
) -> None:
    """Connects this process to the others, like ``jax.distributed.initialize``.

    With arguments, they go to ``jax.distributed.initialize`` as they are (the same
    names and meanings, and any of its other keyword arguments in ``jax_kwargs``), for a
    cluster JAX does not detect. Without, under ``meshfeed launch`` (or
    ``run_in_processes``) it reads the coordinator, the process count and id from the
    environment and uses gloo CPU collectives; elsewhere it calls
    ``jax.distributed.initialize()``, whose auto-detection covers Slurm, Kubernetes,
    MPI and Cloud TPU; and where it detects no cluster (a laptop, a single machine, a
    notebook) it does nothing and JAX runs as one process, without error, so one script
    runs alone and launched. Call it once, before any other JAX call. After a
    ``jax.distributed.initialize`` of your own it only starts the watch (the arguments,
    if given, must be those JAX was initialised with).

    With several processes it starts a watch on them (``watch``): a process that dies
    ends every other within a second, one that is stopped or hung within
    ``heartbeat_timeout`` seconds, each survivor printing one line -- which process was
    lost and what this one was doing -- and exiting with code 1, instead of waiting in
    a collective until JAX aborts it. ``heartbeat_timeout`` is 10 s by default: on this
    project's 2-core test machine, with 4 training processes and a busy loop per core, a
    thread that sleeps a quarter of a second (as the watch's does) woke at most 0.44 s
    late (``benchmarks/lost_process.py``), so 10 s leaves room for a machine far busier
    (swapping, a long garbage collection) before a live process is taken for dead, and
    a dead one is still found in seconds. JAX's own coordination service gets twice it
    (``heartbeat_timeout_seconds``, unless given in ``jax_kwargs``), as the backstop
    that aborts a process if the watch itself could not run.

    The watch also names a process that is alive but stuck (``_stall``): every process
    tells process 0 where it is every few seconds (``min(5, stall_s / 4)``: its step and
    its longest wait in flight, such as a read and its object), and when one has waited
    on one thing longer than ``stall_s`` seconds (300 by default), or a step has not
    finished within ``stall_s`` while a process is behind, every process prints one
    line naming that process, its host, the stage and the object and seconds
    (``on_stall="log"``, the default), or ends the job with that line and exit code 1
    as for a lost process (``"raise"``). A process alone judges its own waits.

    It also makes an uncaught exception end the process at once (exit code 1, traceback
    printed, the other processes told) instead of waiting in ``jax.distributed``'s
    shutdown barrier for processes that may be waiting for this one.

    Raises:
      RuntimeError: it was called before in this process.
      ValueError, TypeError: an argument is malformed (a ``process_id`` outside
        ``num_processes``, a ``coordinator_address`` without a port, ...), or differs
        from what JAX was already initialised with -- each before anything connects.
    """
    import jax

    _check_timeout(heartbeat_timeout)
    check_stall_arguments(stall_s, on_stall)
    given = _check_arguments(coordinator_address, num_processes, process_id, local_device_ids)
    _check_jax_kwargs(jax_kwargs)
    if _initialized_by is not None:
        raise RuntimeError(
            "meshfeed.initialize() was already called in this process"
            f"{_arguments_text(_initialized_by)}; call it once, before any other JAX call."
        )
    jax_timeout = max(10, 2 * math.ceil(heartbeat_timeout))
    jax_kwargs.setdefault("heartbeat_timeout_seconds", jax_timeout)
    coordinator = os.environ.get(ENV_COORDINATOR)
    if jax.distributed.is_initialized():
        coordinator = None  # whatever JAX was told, the watch listens everywhere
        _check_same_as_jax(given)  # someone connected first: only the watch is left to do
    elif given:
        jax.distributed.initialize(**given, **jax_kwargs)
    elif coordinator is not None:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator,
            num_processes=int(os.environ[ENV_NUM_PROCESSES]),
            process_id=int(os.environ[ENV_PROCESS_ID]),
            **jax_kwargs,
        )
    else:
        try:
            jax.distributed.initialize(**jax_kwargs)
        except ValueError as error:
            # JAX found no cluster and was told no coordinator: a single process.
            if "coordinator_address" not in str(error):
                raise
            _set_initialized(given)
            watch_alone(stall_s, on_stall, now_doing)
            return
    _set_initialized(given)
    _exit_on_uncaught_exception()
    if jax.process_count() > 1 and watching() is None:
        where = given.get("coordinator_address") or coordinator
        _start_watch(heartbeat_timeout, where, stall_s=stall_s, on_stall=on_stall)
    elif jax.process_count() == 1:
        watch_alone(stall_s, on_stall, now_doing)


def watch(
    *, heartbeat_timeout: float = HEARTBEAT_TIMEOUT, stall_s: float = STALL_S, on_stall: str = "log"
) -> None:
    """Watches the processes of a job that called ``jax.distributed.initialize`` itself.

    The same watch ``initialize`` starts (see there): a process lost anywhere ends
    every other within seconds, each printing one line and exiting with code 1; and an
    uncaught exception ends its process at once, telling the others; a process stuck
    longer than ``stall_s`` is named on every process (``on_stall``). Call it on every
    process after ``jax.distributed.initialize``, at the same point of the program (the
    processes meet in one broadcast over JAX's connection: no port to open). The loader
    calls it itself, where every process builds its first loader, when several
    processes run and nothing watches them, so a job that builds a ``meshfeed.Loader``
    is watched without it. Does nothing in a single process, or when the watch already
    runs.
    """
    import jax

    _check_timeout(heartbeat_timeout)
    check_stall_arguments(stall_s, on_stall)
    if watching() is not None or not jax.distributed.is_initialized():
        return
    if jax.process_count() > 1:
        _exit_on_uncaught_exception()
        _start_watch(heartbeat_timeout, None, stall_s=stall_s, on_stall=on_stall)


def shutdown() -> None:
    """Ends this process's part in the job, so that it may leave with ``os._exit``.

    A script that ends with ``os._exit(0)`` (to skip Python's exit and JAX's) runs no
    ``atexit`` handler, so the watch never hears its goodbye: its connection just
    closes, and the other processes report it lost and exit with code 1 -- even at the
    end of a finished run. Call ``meshfeed.shutdown()`` before ``os._exit``, once this
    process's JAX work is done, and the others finish normally. In order:

    1. Where ``jax.distributed`` runs, ``jax.distributed.shutdown()``: JAX's shutdown
       barrier, which returns once every process of the job has reached its own (a
       ``shutdown()`` like this one, or a normal exit, which runs JAX's at exit). If
       one has not within ``shutdown_timeout_seconds`` (300 s by default; ``initialize``
       passes it to JAX), JAX aborts every process. The watch runs meanwhile: a process
       lost while this one waits ends it as anywhere else (the watch's line, exit code
       1), not by JAX's abort.
    2. The watch's goodbye, the one a normal exit says: the others stop watching this
       process (all of them stop watching, if it is process 0, the watch's hub).

    Safe anywhere: where neither JAX's distributed system nor the watch runs (one
    process, no ``initialize``) it does nothing, and a second call does nothing.

    Example:
      >>> meshfeed.initialize()  # doctest: +SKIP
      >>> ...  # the run: train, save the last checkpoint
      >>> meshfeed.shutdown()
      >>> os._exit(0)  # the other processes finish normally
    """
    import jax

    watch = watching()
    if jax.distributed.is_initialized():
        if watch is not None:
            doing("in meshfeed.shutdown(), waiting for the other processes")
        jax.distributed.shutdown()
    if watch is not None:
        # After the barrier, not before: until every process has reached it, a process
        # lost anywhere must still end this one with the watch's line.
        watch.bye()


def ensure_watched() -> None:
    """What the loader and ``fit`` check first: raises if this process was started as one
    of several but never connected; starts ``watch()`` on a job of several processes that
    nothing watches yet."""
    import jax

    require_initialized()
    if watching() is None and jax.distributed.is_initialized():
        watch()


def _check_timeout(heartbeat_timeout: object) -> None:
    if isinstance(heartbeat_timeout, bool) or not isinstance(heartbeat_timeout, (int, float)):
        raise TypeError(f"heartbeat_timeout={heartbeat_timeout!r} must be a number of seconds.")
    if not 0.5 <= heartbeat_timeout <= 3600:
        raise ValueError(
            f"heartbeat_timeout={heartbeat_timeout} must be in 0.5..3600 seconds (default "
            f"{HEARTBEAT_TIMEOUT:g})."
        )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_arguments(
    coordinator_address: Any, num_processes: Any, process_id: Any, local_ids: Any
) -> dict[str, Any]:
    """The arguments given (not None), each checked; raises naming a bad one."""
    if coordinator_address is not None:
        host, _, port = str(coordinator_address).rpartition(":")
        if not isinstance(coordinator_address, str) or not host or not port.isdigit():
            raise ValueError(
                f"coordinator_address={coordinator_address!r} must be 'host:port' (process "
                "0's address and a free port on it, the same string on every process)."
            )
    if num_processes is not None and (not _is_int(num_processes) or num_processes < 1):
        raise ValueError(f"num_processes={num_processes!r} must be an int >= 1.")
    if process_id is not None and (not _is_int(process_id) or process_id < 0):
        raise ValueError(f"process_id={process_id!r} must be an int >= 0.")
    if process_id is not None and num_processes is not None and process_id >= num_processes:
        raise ValueError(
            f"process_id={process_id} is outside num_processes={num_processes}: the ids of "
            f"a job of {num_processes} processes are 0..{num_processes - 1}."
        )
    ids = [local_ids] if _is_int(local_ids) else local_ids
    if local_ids is not None and (
        not isinstance(ids, Sequence) or not all(_is_int(i) and i >= 0 for i in ids)
    ):
        raise ValueError(
            f"local_device_ids={local_ids!r} must be a device id or a list of them (ints >= 0)."
        )
    given = {
        "coordinator_address": coordinator_address,
        "num_processes": num_processes,
        "process_id": process_id,
        "local_device_ids": local_ids,
    }
    return {name: value for name, value in given.items() if value is not None}


def _check_jax_kwargs(jax_kwargs: dict[str, Any]) -> None:
    import jax

    known = set(inspect.signature(jax.distributed.initialize).parameters)
    for name in jax_kwargs:
        if name not in known:
            raise TypeError(
                f"meshfeed.initialize() got {name}=, which jax.distributed.initialize does "
                f"not take (its keyword arguments: {', '.join(sorted(known))})."
            )


def _check_same_as_jax(given: dict[str, Any]) -> None:
    """Raises if an argument differs from what JAX was initialised with (the count and
    id; the coordinator and device ids JAX does not tell, so they cannot be given)."""
    import jax

    have = {"num_processes": jax.process_count(), "process_id": jax.process_index()}
    for name, value in given.items():
        if name not in have:
            raise ValueError(
                f"jax.distributed is already initialised, and meshfeed.initialize() cannot "
                f"check {name}={value!r} against what it was given. Connect once: call "
                "meshfeed.initialize(...) instead of jax.distributed.initialize(...), or keep "
                "yours and call meshfeed.watch() after it."
            )
        if value != have[name]:
            raise ValueError(
                f"jax.distributed is already initialised with {name}={have[name]!r}, but "
                f"meshfeed.initialize() got {name}={value!r}. Connect once: call "
                "meshfeed.initialize(...) instead of jax.distributed.initialize(...), or keep "
                "yours and call meshfeed.watch() after it."
            )


def _set_initialized(given: dict[str, Any]) -> None:
    global _initialized_by
    _initialized_by = given


def _arguments_text(given: dict[str, Any]) -> str:
    if not given:
        return ""
    return " (with " + ", ".join(f"{k}={v!r}" for k, v in given.items()) + ")"


def _start_watch(
    timeout: float, coordinator: str | None, *, stall_s: float = STALL_S, on_stall: str = "log"
) -> None:
    """Starts this process's side of the watch; process 0's port goes out by broadcast
    (on the coordinator's host when it is known: process 0 runs the coordinator)."""
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    watch = Watch(
        jax.process_index(), jax.process_count(), timeout, stall_s=stall_s, on_stall=on_stall
    )
    host = coordinator.rsplit(":", 1)[0] if coordinator else None
    message = np.zeros(1 + 4 * _ADDRESSES, np.int32)
    if jax.process_index() == 0:
        message[0] = watch.listen(host or "0.0.0.0")
        for i, address in enumerate(_own_addresses()[:_ADDRESSES]):
            message[1 + 4 * i : 5 + 4 * i] = list(socket.inet_aton(address))
    message = np.asarray(multihost_utils.broadcast_one_to_all(message))
    if jax.process_index() != 0:
        told = [message[1 + 4 * i : 5 + 4 * i] for i in range(_ADDRESSES)]
        hosts = [".".join(str(int(b)) for b in a) for a in told if a.any()]
        watch.connect([host] if host else hosts, int(message[0]))
    watch.start()
    set_watch(watch)


_ADDRESSES = 4


def _own_addresses() -> list[str]:
    """This machine's IPv4 addresses, the loopback last (for the watch's other ends)."""
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
    except OSError:
        infos = []
    found = [str(info[4][0]) for info in infos]
    outside = [a for a in dict.fromkeys(found) if not a.startswith("127.")]
    return [*outside, "127.0.0.1"]


_CAUSED_BY_A_LOST_PEER = 1.0
"""Seconds an uncaught exception waits for the watch to find a peer lost: a collective
or a checkpoint barrier can fail on a dead peer just before the watch says so, and then
the watch's one line says what happened, not a traceback from deep inside JAX."""


def _exit_on_uncaught_exception() -> None:
    """An uncaught exception ends this process at once, with exit code 1.

    Otherwise Python's exit runs ``jax.distributed``'s shutdown, whose barrier waits for
    every other process -- which may be blocked in a collective waiting for this one: a
    hang instead of an error. The traceback is printed first, as usual, and the watch
    tells the other processes.
    """
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        watch = watching()
        if watch is not None and watch.losing(_CAUSED_BY_A_LOST_PEER):
            threading.Event().wait()  # the watch ends this process, with its one line
        previous(kind, value, tb)
        sys.stdout.flush()
        sys.stderr.flush()
        if watch is not None:
            watch.fail(f"{kind.__name__}: {value}")
        os._exit(1)

    sys.excepthook = hook
