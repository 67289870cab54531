"""Watching the other processes: one lost anywhere ends the job in seconds, saying so.

A JAX job of several processes does not notice a dead peer by itself in good time: the
survivors wait inside a collective (a training step's all-reduce, Orbax's save
barrier) until ``jax.distributed``'s heartbeat timeout -- 100 s by default -- and then
JAX aborts them with a C++ message. ``meshfeed.initialize()`` starts this watch beside
it (``meshfeed.watch()``, or the loader, for a job connected by
``jax.distributed.initialize``): process 0 listens on a TCP port (told to the others
with one broadcast), every other process keeps one connection to it, and each side
sends a byte every quarter of ``timeout``. A process that dies (killed, crashed) closes
its connection at once, so the watch on process 0 sees it within milliseconds; one that
is stopped or hung sends nothing and is declared lost after ``timeout`` seconds of
silence; one whose Python raised says so before it exits. Process 0 tells every other
process, and each survivor prints one line -- which process was lost, how, and what
this process was doing (``doing`` records it: the step being trained or loaded, the
checkpoint being saved) -- and exits with code 1 from the watch's thread, whatever its
main thread is blocked in. A process that ends normally says goodbye first (an
``atexit`` handler, or ``meshfeed.shutdown()`` for a script that ends with ``os._exit``,
which runs no handler), so the others stop watching it.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from typing import NoReturn

from meshfeed.cluster._preemption import ROUND, preemption
from meshfeed.cluster._stall import STALL_S, Stalls, progress, say

_activity = "starting"
_LET_IT_EXIT = 1.0
"""Seconds a survivor waits before exiting when a peer failed by itself, so that the
failing process exits first and a supervisor names it as the first to fail."""
_HEARTBEAT, _BYE, _HELLO, _FAIL, _LOST = b".", b"b", b"h", b"f", b"l"
_PROGRESS, _STALL = b"p", b"s"  # a process's progress (to process 0), a stall line (from it)
_LINES = (_HELLO, _FAIL, _LOST, _PROGRESS, _STALL, *ROUND)  # ROUND: a preemption's


def doing(what: str) -> None:
    """Records what this process is doing, for the line a lost peer makes it print."""
    global _activity
    _activity = what


def now_doing() -> str:
    """What this process is doing, as ``doing`` last recorded it."""
    return _activity


@contextlib.contextmanager
def activity(what: str) -> Iterator[None]:
    """``doing(what)`` for the block, then back to what it was -- unless the block
    raises: an error that a lost peer caused is reported as happening in the block."""
    before = _activity
    doing(what)
    yield
    doing(before)


class _Peer:
    def __init__(self, sock: socket.socket, now: float) -> None:
        self.sock = sock
        self.seen = now
        self.buffer = b""
        self.process_id: int | None = None

    def messages(self, data: bytes) -> Iterator[tuple[bytes, str]]:
        """The whole messages ``data`` completes, as (kind, text): a line's text, or ""
        for a one-byte message; a partial line waits for the rest."""
        self.buffer += data
        while self.buffer:
            kind, rest = self.buffer[:1], self.buffer[1:]
            if kind not in _LINES:
                self.buffer = rest
                yield kind, ""
                continue
            line, found, after = rest.partition(b"\n")
            if not found:
                return  # the rest of the message is still on its way
            self.buffer = after
            yield kind, line.decode(errors="replace")


class Watch:
    """This process's side of the watch (process 0 is the hub, the others its clients)."""

    def __init__(
        self,
        process_id: int,
        num_processes: int,
        timeout: float,
        *,
        stall_s: float = STALL_S,
        on_stall: str = "log",
    ) -> None:
        self.process_id = process_id
        self.num_processes = num_processes
        self.timeout = timeout
        self._tick = min(timeout / 4, 1.0)
        self._stalls = Stalls(num_processes, stall_s, on_stall=on_stall)
        self._lock = threading.Lock()
        self._peers: list[_Peer] = []
        self._listener: socket.socket | None = None
        self._joined = 0  # processes that said hello (process 0)
        self._done = self._said_bye = False
        self._losing = threading.Event()
        self._thread: threading.Thread | None = None
        # bye() wakes the thread here and joins it: a daemon thread still running while
        # Python finalizes is ended by pthread_exit, which can abort the process.
        self._stop_r, self._stop_w = os.pipe()

    def listen(self, host: str) -> int:
        """Process 0: opens the hub's port on ``host``; returns it."""
        self._listener = socket.create_server((host, 0))
        return self._listener.getsockname()[1]

    def connect(self, hosts: list[str], port: int) -> None:
        """Another process: connects to process 0's hub, trying each host in turn."""
        errors = []
        for host in hosts:
            try:
                sock = socket.create_connection((host, port), timeout=max(self.timeout, 5.0))
            except OSError as error:
                errors.append(f"{host}: {error}")
                continue
            sock.sendall(_HELLO + f"{self.process_id}\n".encode())
            self._peers.append(_Peer(sock, time.monotonic()))
            self._peers[0].process_id = 0
            return
        raise OSError(f"could not reach process 0's watch on port {port} ({'; '.join(errors)})")

    def start(self) -> None:
        self._preemption = preemption()  # made here: no JAX call on the watch's thread
        self._thread = threading.Thread(target=self._run, name="meshfeed-watch", daemon=True)
        self._thread.start()
        atexit.register(self.bye)

    def bye(self) -> None:
        """This process ends normally: the others stop watching it (said once: at exit,
        or earlier by ``meshfeed.shutdown()``; a second call does nothing)."""
        if self._said_bye:
            return
        self._said_bye = True
        # Done first: the peer that hears the goodbye drops the connection at once, and
        # that must not read here as the peer lost.
        self._done = True
        self._send_all(_BYE)
        with contextlib.suppress(OSError):
            os.write(self._stop_w, b"!")
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)

    def fail(self, text: str) -> None:
        """This process is about to exit with an error: the others hear why."""
        self._done = True
        self._send_all(_FAIL + text.replace("\n", " ")[:300].encode() + b"\n")

    def losing(self, wait: float) -> bool:
        """Whether the watch finds a peer lost within ``wait`` seconds (it is then
        ending this process, with its own line)."""
        return self._losing.wait(wait)

    def _send_all(self, message: bytes) -> None:
        with self._lock:
            for peer in self._peers:
                with contextlib.suppress(OSError):
                    peer.sock.sendall(message)

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        if self._listener is not None:
            selector.register(self._listener, selectors.EVENT_READ)
        for peer in self._peers:
            selector.register(peer.sock, selectors.EVENT_READ, peer)
        wakeup = self._preemption.wakeup  # a SIGTERM's handler writes here: heard at once
        selector.register(wakeup, selectors.EVENT_READ, "wakeup")
        selector.register(self._stop_r, selectors.EVENT_READ, "stop")
        started = last_beat = last_progress = time.monotonic()
        while not self._done:
            for key, _ in selector.select(self._tick):
                if key.data == "wakeup":
                    os.read(wakeup, 64)
                elif key.data == "stop":
                    break
                elif key.data is None:  # a new connection to the hub
                    sock, _ = self._listener.accept()  # type: ignore[union-attr]
                    peer = _Peer(sock, time.monotonic())
                    with self._lock:
                        self._peers.append(peer)
                    selector.register(sock, selectors.EVENT_READ, peer)
                elif not self._read(key.data):
                    selector.unregister(key.data.sock)
            now = time.monotonic()
            if now - last_beat >= self._tick:
                self._send_all(_HEARTBEAT)
                last_beat = now
            if now - last_progress >= self._stalls.every_s:
                self._progress()
                last_progress = now
            self._preempted()
            self._check_silence(now, started)

    def _progress(self) -> None:
        """Tells process 0 where this process is; process 0 names the stalls it finds."""
        text = json.dumps(progress(_activity))
        if self._listener is None:
            self._send_all(_PROGRESS + text.encode() + b"\n")
            return
        self._stalls.heard(0, text)
        for process_id, reason in self._stalls.found():
            if self._stalls.on_stall == "raise":
                self._lost(process_id, reason)
            line = f"process {process_id} of {self.num_processes} {reason}"
            self._send_all(_STALL + line.encode() + b"\n")
            say(f"{line}, while process {self.process_id} was {_activity}.")

    def _preempted(self) -> None:  # told of a preemption: process 0 hears it
        for message in self._preemption.tick(hub=self._listener is not None):
            self._send_all(message)

    def _read(self, peer: _Peer) -> bool:
        """Reads what ``peer`` sent; ``False`` once it has said goodbye."""
        try:
            data = peer.sock.recv(4096)
        except OSError:
            data = b""
        if not data:
            if self._done:
                return False
            self._lost(peer.process_id, "was lost (its connection closed: killed or crashed)")
        peer.seen = time.monotonic()
        for kind, text in peer.messages(data):
            if kind == _HELLO:
                peer.process_id = int(text)
                self._joined += 1
            elif kind == _PROGRESS and peer.process_id is not None:
                self._stalls.heard(peer.process_id, text)
            elif kind == _STALL:
                say(f"{text}, while process {self.process_id} was {_activity}.")
            elif kind == _FAIL:
                self._lost(peer.process_id, f"failed ({text})", after=_LET_IT_EXIT)
            elif kind == _LOST:
                who, _, reason = text.partition(" ")
                wait = _LET_IT_EXIT if reason.startswith("failed") else 0.0
                self._lost(int(who), reason, forward=False, after=wait)
            elif kind == _BYE:
                with self._lock:
                    self._peers.remove(peer)
                if self._listener is None:  # process 0 ended: nothing left to watch
                    self._done = True
                return False
            elif kind in ROUND:  # a preemption's round (``_preemption``)
                for message in self._preemption.heard(kind, text):
                    self._send_all(message)
        return True

    def _check_silence(self, now: float, started: float) -> None:
        with self._lock:
            peers = list(self._peers)
        for peer in peers:
            if now - peer.seen > self.timeout:
                self._lost(
                    peer.process_id,
                    f"went silent (no heartbeat for {now - peer.seen:.1f} s: stopped or hung)",
                )
        missing = self._listener is not None and self._joined < self.num_processes - 1
        if missing and now - started > 2 * self.timeout + 10:
            self._lost(None, f"never connected to process 0's watch in {now - started:.0f} s")

    def _lost(
        self, process_id: int | None, reason: str, *, forward: bool = True, after: float = 0.0
    ) -> NoReturn:
        self._losing.set()
        who = "a process" if process_id is None else f"process {process_id}"
        if forward and self._listener is not None and process_id is not None:
            self._send_all(_LOST + f"{process_id} {reason}\n".encode())
        time.sleep(after)
        say(
            f"{who} of {self.num_processes} {reason} while process "
            f"{self.process_id} was {_activity}; exiting with code 1."
        )
        os._exit(1)


_watch: Watch | None = None


def watching() -> Watch | None:
    """This process's watch, once ``initialize`` has started it."""
    return _watch


def set_watch(watch: Watch) -> None:
    global _watch
    _watch = watch
