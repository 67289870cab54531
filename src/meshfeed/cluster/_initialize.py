"""Connecting the processes of a job, and watching them once connected.

``initialize`` is ``jax.distributed.initialize`` for meshfeed's three situations --
started by ``meshfeed launch`` (or ``run_in_processes``), started by a cluster manager
that JAX detects, or started alone -- with the same call in the same script, and with
a watch (``_watch``) that ends the job in seconds when a process is lost.
"""

from __future__ import annotations

import math
import os
import socket
import sys
import threading
from typing import Any

from meshfeed.cluster._env import ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID
from meshfeed.cluster._watch import Watch, set_watch, watching

HEARTBEAT_TIMEOUT = 10.0
"""Seconds of silence after which a process is declared lost (see ``initialize``)."""


def initialize(*, heartbeat_timeout: float = HEARTBEAT_TIMEOUT) -> None:
    """Connects this process to the others, like ``jax.distributed.initialize``.

    Under ``meshfeed launch`` (or ``run_in_processes``) it reads the coordinator, the
    process count and id from the environment and uses gloo CPU collectives. Elsewhere
    it calls ``jax.distributed.initialize()``, whose auto-detection covers Slurm,
    Kubernetes, MPI and Cloud TPU; and where it detects no cluster (a laptop, a single
    machine, a notebook) it does nothing and JAX runs as one process, without error, so
    one script runs alone and launched. Call it before any other JAX call.

    With several processes it starts a watch on them (``_watch``): a process that dies
    ends every other within a second, one that is stopped or hung within
    ``heartbeat_timeout`` seconds, each survivor printing one line -- which process was
    lost and what this one was doing -- and exiting with code 1, instead of waiting in
    a collective until JAX aborts it. ``heartbeat_timeout`` is 10 s by default: on this
    project's 2-core test machine, with 4 training processes and a busy loop per core, a
    thread that sleeps a quarter of a second (as the watch's does) woke at most 0.44 s
    late (``benchmarks/lost_process.py``), so 10 s leaves room for a machine far busier
    (swapping, a long garbage collection) before a live process is taken for dead, and
    a dead one is still found in seconds. JAX's own coordination service gets twice it
    (``heartbeat_timeout_seconds``), as the
    backstop that aborts a process if the watch itself could not run.

    It also makes an uncaught exception end the process at once (exit code 1, traceback
    printed, the other processes told) instead of waiting in ``jax.distributed``'s
    shutdown barrier for processes that may be waiting for this one.
    """
    import jax

    if isinstance(heartbeat_timeout, bool) or not isinstance(heartbeat_timeout, (int, float)):
        raise TypeError(f"heartbeat_timeout={heartbeat_timeout!r} must be a number of seconds.")
    if not 0.5 <= heartbeat_timeout <= 3600:
        raise ValueError(
            f"heartbeat_timeout={heartbeat_timeout} must be in 0.5..3600 seconds (default "
            f"{HEARTBEAT_TIMEOUT:g})."
        )
    jax_timeout = max(10, 2 * math.ceil(heartbeat_timeout))
    coordinator = os.environ.get(ENV_COORDINATOR)
    _exit_on_uncaught_exception()
    if coordinator is None:
        try:
            jax.distributed.initialize(heartbeat_timeout_seconds=jax_timeout)
        except ValueError as error:
            # JAX found no cluster and was told no coordinator: a single process.
            if "coordinator_address" not in str(error):
                raise
            return
    else:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator,
            num_processes=int(os.environ[ENV_NUM_PROCESSES]),
            process_id=int(os.environ[ENV_PROCESS_ID]),
            heartbeat_timeout_seconds=jax_timeout,
        )
    if jax.process_count() > 1:
        _start_watch(heartbeat_timeout, coordinator)


def _start_watch(timeout: float, coordinator: str | None) -> None:
    """Starts this process's side of the watch; process 0's port goes out by broadcast."""
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    watch = Watch(jax.process_index(), jax.process_count(), timeout)
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
