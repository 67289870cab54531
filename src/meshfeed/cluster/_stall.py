"""Stalls named on every process: a process alive but stuck, and on what.

A process that is alive but stuck (a storage read that never answers, say) keeps its
heartbeats going, so the watch does not take it for lost, and its peers wait in a
collective with no word of which process holds them up -- for 4 h 34 min once, on a
pod of 704 (marin #8538). So every process with a watch tells process 0 where it is
every ``every_s`` seconds (a ``Progress``: its host, the step its loader last handed
out, what it is doing, and its longest wait in flight -- the stage, the object and the
seconds, from ``WAITS``), over the watch's own connection. Process 0 (``Stalls``) names:

- a process that has waited longer than ``stall_s`` on one thing (a read, the object);
- when a step has not finished within ``stall_s`` on the processes furthest on, each
  process behind them: its step and what it waits on.

Each finding is one line, made once, that process 0 sends every process to print
(``on_stall="log"``), or the reason the watch ends the job with, every process printing
it and exiting with code 1 (``"raise"``). Alone (one process, or no watch) a process
judges its own waits and prints its own line.

Why the watch's connection and not JAX's coordination service: its key-value store is
reachable only through JAX's private modules, which meshfeed does not read, while the
watch already holds one connection from every process to process 0. Cost: one message
of ~130 bytes a process every ``every_s`` (5 s by default: ``min(5, stall_s / 4)``);
made and judged every 0.25 s, 0.999x the loader's steps/s (``benchmarks/stalls.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from typing import Any, NoReturn

from meshfeed.core._waits import WAITS

STALL_S = 300.0  # a wait, or a step unfinished, longer than this is a stall (default)
ON_STALL = ("log", "raise")


def check_stall_arguments(stall_s: object, on_stall: object) -> None:
    """Raises naming a malformed ``stall_s`` or ``on_stall``."""
    if isinstance(stall_s, bool) or not isinstance(stall_s, (int, float)) or not stall_s > 0:
        raise ValueError(f"stall_s={stall_s!r} must be a number of seconds > 0 (default 300).")
    if on_stall not in ON_STALL:
        raise ValueError(f"on_stall={on_stall!r} must be 'log' or 'raise'.")


def every_s(stall_s: float) -> float:
    """Seconds between two progress messages for ``stall_s``."""
    return min(5.0, stall_s / 4)


def progress(doing: str) -> dict[str, Any]:
    """This process's progress now: host, step, seconds at it, doing, longest wait."""
    wait = WAITS.longest()
    return {
        "host": socket.gethostname(),
        "step": WAITS.step,
        "step_s": round(time.monotonic() - WAITS.step_at, 1),
        "doing": doing,
        "wait": None if wait is None else [wait[0], wait[1], round(wait[2], 1)],
    }


class Stalls:
    """The processes' latest progress, and the stalls found in it (each named once);
    ``on_stall``: what the watch does with one (``"log"`` or ``"raise"``)."""

    def __init__(self, num_processes: int, stall_s: float, *, on_stall: str = "log") -> None:
        self.num_processes = num_processes
        self.stall_s = stall_s
        self.on_stall = on_stall
        self.every_s = every_s(stall_s)  # seconds between two progress messages
        self._latest: dict[int, dict[str, Any]] = {}
        self._named: set[tuple[Any, ...]] = set()

    def heard(self, process_id: int, text: str) -> None:
        """A process's progress message."""
        with contextlib.suppress(ValueError):  # a torn message: the next comes in seconds
            self._latest[process_id] = json.loads(text)

    def found(self) -> list[tuple[int, str]]:
        """New stalls: (the process, the reason it is named for)."""
        out = []
        for pid, p in sorted(self._latest.items()):
            wait = p.get("wait")
            if wait and wait[2] > self.stall_s and self._first(pid, "wait", wait[1]):
                waited = f"waited {wait[2]:.0f} s on {wait[0]} {wait[1]}"
                out.append((pid, f"stalled: {waited} (host {p['host']}, {p['doing']})"))
        steps = {pid: p["step"] for pid, p in self._latest.items() if p.get("step") is not None}
        if not steps:
            return out
        lead = max(steps.values())
        held = [p["step_s"] for pid, p in self._latest.items() if steps.get(pid) == lead]
        if min(held) <= self.stall_s:
            return out
        for pid, p in sorted(self._latest.items()):
            if steps.get(pid, -1) < lead and self._first(pid, "behind", lead):
                wait = p.get("wait")
                on = f"waiting {wait[2]:.0f} s on {wait[0]} {wait[1]}" if wait else p["doing"]
                at = "has no step yet" if p.get("step") is None else f"is at step {p['step']}"
                reason = (
                    f"is behind: step {lead} has not finished in {min(held):.0f} s on the "
                    f"processes at it, and this one {at} (host {p['host']}), {on}"
                )
                out.append((pid, reason))
        return out

    def _first(self, *key: Any) -> bool:
        if key in self._named:
            return False
        self._named.add(key)
        return True


def say(text: str) -> None:
    """One line on stderr, as the watch prints its."""
    sys.stdout.flush()
    sys.stderr.write(f"meshfeed: {text}\n")
    sys.stderr.flush()


def watch_alone(stall_s: float, on_stall: str, doing: Any) -> None:
    """A process with no watch judges its own waits on a thread (``doing()``: what it is
    doing now)."""
    stalls = Stalls(1, stall_s)

    def run() -> NoReturn:
        while True:
            time.sleep(every_s(stall_s))
            stalls.heard(0, json.dumps(progress(doing())))
            for _, reason in stalls.found():
                if on_stall == "raise":
                    say(f"process 0 of 1 {reason}; exiting with code 1.")
                    os._exit(1)
                say(f"process 0 of 1 {reason}.")

    threading.Thread(target=run, name="meshfeed-stalls", daemon=True).start()
