"""Several JAX processes on this machine: start them, connect them, watch them.

JAX has no local multi-process launcher. ``start_processes`` starts N copies of a
command, each with the environment ``initialize()`` reads (coordinator address on
127.0.0.1, process count and id, CPU devices per process), and ``supervise`` waits for
them: when one exits non-zero, the others are stopped at once, so a failure never turns
into a hang in a collective. ``meshfeed.testing.run_in_processes`` and the
``meshfeed launch`` command both run on these two functions.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from meshfeed.cluster._env import ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_port(port: int) -> None:
    """Raises if ``port`` on 127.0.0.1 cannot host the coordinator."""
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise ValueError(f"port={port!r} must be an int in 1..65535.")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise OSError(
                f"port {port} on 127.0.0.1 is in use; pass another port, or none to let "
                "meshfeed pick a free one."
            ) from None


def process_env(
    process_id: int, num_processes: int, devices_per_process: int, coordinator: str
) -> dict[str, str]:
    """The environment of one launched process."""
    env = dict(os.environ)
    env.update(
        {
            ENV_COORDINATOR: coordinator,
            ENV_NUM_PROCESSES: str(num_processes),
            ENV_PROCESS_ID: str(process_id),
            "JAX_PLATFORMS": env.get("JAX_PLATFORMS", "cpu"),
            "PYTHONUNBUFFERED": "1",
        }
    )
    flags = [
        f
        for f in env.get("XLA_FLAGS", "").split()
        if not f.startswith("--xla_force_host_platform_device_count")
    ]
    env["XLA_FLAGS"] = " ".join(
        [*flags, f"--xla_force_host_platform_device_count={devices_per_process}"]
    )
    return env


LineHandler = Callable[[int, str], None]
_TAIL_LINES = 200


@dataclass
class Child:
    """One launched process, with where its output goes."""

    process_id: int
    popen: subprocess.Popen[bytes]
    log: Path | None = None
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=_TAIL_LINES))
    reader: threading.Thread | None = None

    def output_tail(self, limit: int = 4000) -> str:
        """The end of what the process printed (from its log file or its pipe)."""
        if self.log is not None and self.log.exists():
            return self.log.read_bytes()[-limit:].decode(errors="replace")
        if self.reader is not None:
            self.reader.join(timeout=2.0)
        return "".join(self.tail)[-limit:] or "(no output)"


_GLOO_START = "[Gloo] Rank "
_GLOO_PIECES = re.compile(
    r"(?:\[Gloo\] Rank | is connected to | peer ranks\. "
    r"|Expected number of connected peer ranks is : |\d+|\s)*"
)


class GlooFilter:
    """Tells gloo's connection reports (``[Gloo] Rank 7 is connected to 7 peer ranks.
    Expected number of connected peer ranks is : 7``) from a process's own output.

    Each CPU device's thread writes its report piece by piece, so on 4 devices the
    pieces interleave: a line may hold two reports' halves, and the newlines they owe
    come later as lines of a number or nothing. A line made only of report pieces is
    chatter; a bare number or blank line is chatter only while reports started on
    earlier lines still owe their newline (one per ``[Gloo] Rank``).
    """

    def __init__(self) -> None:
        self._owed = 0

    def chatter(self, line: str) -> bool:
        text = line.rstrip("\n")
        if not _GLOO_PIECES.fullmatch(text):
            return False
        if text.strip() and not text.strip().isdigit():
            self._owed += text.count(_GLOO_START)
        elif not self._owed:
            return False  # the program's own number or blank line
        self._owed = max(self._owed - 1, 0)  # this line's newline was one report's
        return True


def _pump(child: Child, stream: IO[bytes], on_line: LineHandler) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace")
        child.tail.append(line)
        on_line(child.process_id, line)
    stream.close()


def start_processes(
    argv: Sequence[str],
    *,
    num_processes: int,
    devices_per_process: int,
    log_dir: Path | None = None,
    on_line: LineHandler | None = None,
    extra_env: Mapping[str, str] | None = None,
    port: int | None = None,
) -> list[Child]:
    """Starts ``num_processes`` copies of ``argv`` wired to one coordinator.

    Output (stdout and stderr together) goes, per process, to ``log_dir/process_<i>.log``
    with ``log_dir``; line by line to ``on_line(process_id, line)`` with ``on_line``;
    otherwise to this process's streams.
    """
    if num_processes < 1 or devices_per_process < 1:
        raise ValueError(
            f"num_processes={num_processes} and devices_per_process={devices_per_process} "
            "must both be >= 1."
        )
    if port is not None:
        check_port(port)
    coordinator = f"127.0.0.1:{port or free_port()}"
    children = []
    for i in range(num_processes):
        env = process_env(i, num_processes, devices_per_process, coordinator)
        env.update(extra_env or {})
        log = None if log_dir is None else log_dir / f"process_{i}.log"
        out: IO[bytes] | int | None = None
        if log is not None:
            out = log.open("wb")
        elif on_line is not None:
            out = subprocess.PIPE
        try:
            popen = subprocess.Popen(
                list(argv), env=env, stdout=out, stderr=None if out is None else subprocess.STDOUT
            )
        finally:
            if log is not None and not isinstance(out, int) and out is not None:
                out.close()
        child = Child(i, popen, log)
        if on_line is not None and log is None and popen.stdout is not None:
            child.reader = threading.Thread(
                target=_pump, args=(child, popen.stdout, on_line), daemon=True
            )
            child.reader.start()
        children.append(child)
    return children


def stop(children: Sequence[Child], *, grace_s: float = 2.0) -> None:
    """Stops every child still running: SIGTERM, then SIGKILL after ``grace_s``."""
    for child in children:
        if child.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.popen.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for child in children:
        try:
            child.popen.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.popen.kill()
            child.popen.wait()


def supervise(
    children: Sequence[Child], *, timeout_s: float | None = None, poll_s: float = 0.05
) -> tuple[Child | None, bool]:
    """Waits for the children; stops them all as soon as one fails.

    Returns:
      ``(first child that exited non-zero or None, timed_out)``.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while True:
            running = False
            for child in children:
                code = child.popen.poll()
                if code is None:
                    running = True
                elif code != 0:
                    stop(children)
                    return child, False
            if not running:
                for child in children:
                    if child.reader is not None:
                        child.reader.join(timeout=5.0)
                return None, False
            if deadline is not None and time.monotonic() > deadline:
                stop(children)
                return None, True
            time.sleep(poll_s)
    except BaseException:
        stop(children)
        raise


def launch(
    argv: Sequence[str],
    *,
    num_processes: int = 2,
    devices_per_process: int = 4,
    timeout_s: float | None = None,
    port: int | None = None,
) -> int:
    """Runs ``argv`` as ``num_processes`` connected processes on this machine.

    Each process gets the environment ``meshfeed.initialize()`` reads (coordinator on
    127.0.0.1 at a free port, process count and id) and ``devices_per_process`` CPU
    devices. Output lines are prefixed with ``[process index]``. When a process exits
    non-zero, the others are stopped at once (SIGTERM, then SIGKILL after 2 s); Ctrl-C
    stops them all too. Gloo's connection reports are left out of the output (a failing
    process's tail keeps them).

    Returns:
      0 when every process succeeded, else the first failing process's exit code (124
      on timeout, 130 on Ctrl-C).
    """
    if not argv:
        raise ValueError("launch needs a command, e.g. launch(['python', 'train.py']).")
    lock = threading.Lock()

    filters: dict[int, GlooFilter] = {}

    def show(process_id: int, line: str) -> None:
        if filters.setdefault(process_id, GlooFilter()).chatter(line):
            return
        with lock:
            sys.stdout.write(f"[{process_id}] {line}")
            sys.stdout.flush()

    children = start_processes(
        argv,
        num_processes=num_processes,
        devices_per_process=devices_per_process,
        on_line=show,
        port=port,
    )
    try:
        failed, timed_out = supervise(children, timeout_s=timeout_s)
    except KeyboardInterrupt:
        sys.stderr.write("meshfeed launch: interrupted; stopped every process\n")
        return 130
    if timed_out:
        sys.stderr.write(f"meshfeed launch: still running after {timeout_s} s; stopped them\n")
        return 124
    if failed is not None:
        code = failed.popen.returncode
        sys.stderr.write(
            f"meshfeed launch: process {failed.process_id} exited with code {code}; "
            "stopped the others\n"
        )
        return code if code and code > 0 else 1
    return 0


def python_argv(code: str) -> list[str]:
    """``argv`` that runs ``code`` in this Python interpreter."""
    return [sys.executable, "-c", code]
