"""``worker_type="ray"``: record workers as Ray actors, on any node of a cluster.

``RayWorkers(fn, W, source)`` starts W actors (``_ray_actor.RecordWorker``) on the
cluster ``_ray_connect.connect`` reaches. Actors, not tasks: each unpickles the
transform and opens the source once and keeps them, and each runs its calls in order,
so the loader keeps every worker's queue full with the steps it reads ahead (one chunk
per worker a step) without flooding Ray's scheduler; what each reserves (CPUs, a custom
resource) is placed once.

Work is keyed by ``(step, chunk)``: a step's ids are cut into chunks, each chunk a
token, and only ids go out (the actor reads the source itself); finished rows come back
through Ray's object store, mapped rather than copied, and are copied once, into the
step's rows. A chunk's rows depend on its ids, the seed and the epoch alone, so when a
worker is lost -- its process killed, its node gone -- every chunk it had in hand is
sent again to the workers left, a new worker is started in its place, and a reply that
still comes from the old call is never read: each chunk is counted once, whichever
call computed it. One line on stderr says which worker was lost. With no worker left
for ``RayOptions.replace_s`` seconds (the cluster has no room for a new one), the
loader raises.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
import time
import weakref
from typing import Any

import numpy as np

from meshfeed.workers._ray_actor import Reply, actor_class
from meshfeed.workers._ray_connect import RayOptions, connect
from meshfeed.workers._record_rows import RecordFn, chunks
from meshfeed.workers._shm import Spec
from meshfeed.workers._workers import send_by_value

_POLL_S = 0.2
_START_S = 10.0  # a worker not started by then has its chunks done by the others,
_BEHIND_S = 3.0  # as has one not started this long after another did


@dataclasses.dataclass(eq=False)
class _Actor:
    index: int
    handle: Any
    where: Any  # the ref of its (pid, node id)
    started: float
    in_hand: dict[int, _Chunk] = dataclasses.field(default_factory=dict)
    alive: bool = False  # it answered ``where``
    lost: bool = False
    said: bool = False  # that it has not started
    alive_at: float = 0.0

    def name(self, ray: Any) -> str:
        if not self.alive:
            return f"Ray record worker {self.index} (not yet started)"
        pid, node = ray.get(self.where)
        return f"Ray record worker {self.index} (pid {pid} on node {node[:12]})"


@dataclasses.dataclass(eq=False)
class _Chunk:
    token: int
    lo: int
    ids: np.ndarray
    spec: dict[str, Any]
    seed: int
    epoch: int
    ref: Any = None
    actor: _Actor | None = None


@dataclasses.dataclass(eq=False)
class RayTicket:
    """One step's rows handed to the Ray workers: its chunks (none for all-padding ones)."""

    rows: int
    spec: dict[str, Any]
    chunks: list[_Chunk]


class RayWorkers:
    """W Ray actors that read ``source`` and run ``fn`` on chunks of example ids."""

    def __init__(
        self,
        fn: RecordFn,
        num_workers: int,
        source: Any,
        *,
        options: RayOptions,
        skip: bool = False,
        timeout_s: float = 600.0,
    ) -> None:
        self.num_workers, self.options, self.timeout_s = num_workers, options, timeout_s
        self._ray = ray = connect(options)
        try:
            source_ref = ray.put(source)
        except Exception as error:
            raise TypeError(
                f"the source cannot be sent to Ray record workers: {type(error).__name__}: "
                f"{error}. Give the loader a source that pickles (a meshfeed folder, files, "
                "URLs or numpy arrays), or use worker_type='processes'."
            ) from None
        self._init = (list(sys.path), send_by_value(fn), [source_ref], skip)
        self._class = ray.remote(actor_class()).options(
            num_cpus=options.cpus, resources=dict(options.resources) or None, max_restarts=0
        )
        self._lock = threading.Lock()
        self._actors: list[_Actor] = []
        self._token, self._lost = 0, 0
        self._none_since: float | None = None
        _say_if_too_small(ray, options, num_workers)
        for _ in range(num_workers):
            self._start_actor()
        self._finalizer = weakref.finalize(self, RayWorkers._stop, ray, self._actors)

    def _start_actor(self) -> _Actor:
        handle = self._class.remote(*self._init)
        index = len(self._actors)
        actor = _Actor(index, handle, handle.where.remote(), time.monotonic())
        self._actors.append(actor)
        return actor

    def submit_ids(self, ids: np.ndarray, spec: Spec, seed: int, epoch: int) -> RayTicket:
        """Hands the examples ``ids`` (-1: padding) to the workers; returns at once."""
        ticket = RayTicket(len(ids), dict(spec), [])
        with self._lock:
            for lo, hi in chunks(len(ids), self.num_workers):
                part = ids[lo:hi]
                if not (part >= 0).any():
                    continue  # all padding: zeros, no call
                self._token += 1
                part = np.ascontiguousarray(part)
                chunk = _Chunk(self._token, lo, part, ticket.spec, seed, epoch)
                self._send(chunk)
                ticket.chunks.append(chunk)
        return ticket

    def _send(self, chunk: _Chunk) -> None:
        """Sends ``chunk`` to the live worker with the least in hand (started ones first)."""
        self._check_started()
        live = [a for a in self._actors if not a.lost]
        actor = min(live, key=lambda a: (not a.alive, len(a.in_hand)))
        chunk.actor = actor
        chunk.ref = actor.handle.run.remote(chunk.ids, chunk.spec, chunk.seed, chunk.epoch)
        actor.in_hand[chunk.token] = chunk

    def _check_started(self) -> None:
        waiting = [a for a in self._actors if not a.lost and not a.alive]
        if waiting:
            refs = [a.where for a in waiting]
            ready_ids = set(self._ray.wait(refs, num_returns=len(refs), timeout=0)[0])
            for actor in waiting:
                if actor.where in ready_ids:
                    try:
                        self._ray.get(actor.where)
                        actor.alive, actor.alive_at = True, time.monotonic()
                    except Exception as error:  # it died before it started
                        self._lose(actor, error)

    def collect(
        self, ticket: RayTicket
    ) -> tuple[dict[str, np.ndarray], list[tuple[int, int, str]]]:
        """Waits for ``ticket``'s rows; returns them, and the records skipped."""
        out = {k: np.empty((ticket.rows, *s.shape), s.dtype) for k, s in ticket.spec.items()}
        done = np.zeros(ticket.rows, bool)
        skipped: list[tuple[int, int, str]] = []
        for chunk, reply in zip(ticket.chunks, self._replies(ticket.chunks), strict=True):
            data, chunk_skipped, error = reply
            if error is not None:
                raise RuntimeError(
                    f"record_transform raised on example {error[0]} in a Ray record worker:\n"
                    f"{error[1]}"
                )
            assert data is not None
            hi = chunk.lo + len(chunk.ids)
            for name, rows in data.items():
                out[name][chunk.lo : hi] = rows
            done[chunk.lo : hi] = True
            skipped += [(chunk.lo + row, i, line) for row, i, line in chunk_skipped]
        if not done.all():
            for array in out.values():
                array[~done] = 0
        return out, skipped

    def _replies(self, chunks: list[_Chunk]) -> list[Reply]:
        """The replies to ``chunks``: all at once when they are in (the read-ahead's
        usual case), else one by one, each sent again as often as its worker is lost."""
        refs = [c.ref for c in chunks]
        with contextlib.suppress(Exception):  # a failure: the slow path says what
            if len(self._ray.wait(refs, num_returns=len(refs), timeout=_POLL_S)[0]) == len(refs):
                replies = self._ray.get(refs)
                with self._lock:
                    for chunk in chunks:
                        if chunk.actor is not None:
                            chunk.actor.in_hand.pop(chunk.token, None)
                return replies
        return [self._result(chunk) for chunk in chunks]

    def _result(self, chunk: _Chunk) -> Reply:
        """The reply to ``chunk``, sent again as often as its worker is lost."""
        ray = self._ray
        waited = time.monotonic()
        while True:
            ref = chunk.ref
            ready, _ = ray.wait([ref], timeout=_POLL_S)
            if ready:
                try:
                    reply = ray.get(ref)
                except Exception as error:
                    if isinstance(error, ray.exceptions.RayTaskError):
                        raise
                    self._redo(chunk, ref, error)
                    continue
                with self._lock:
                    if chunk.actor is not None:
                        chunk.actor.in_hand.pop(chunk.token, None)
                return reply
            with self._lock:
                self._check_started()
                self._check_left()
                self._move_if_stuck(chunk)
            if time.monotonic() - waited > self.timeout_s:
                raise RuntimeError(
                    f"a chunk of record work sent to {chunk.actor and chunk.actor.name(ray)} "
                    f"had no reply for {self.timeout_s:g} s."
                )

    def _move_if_stuck(self, chunk: _Chunk) -> None:
        """Sends ``chunk`` again to a started worker if its own has not started within
        ``_START_S`` (the cluster has no room for it yet); says so once per worker."""
        actor = chunk.actor
        if actor is None or actor.alive or actor.lost:
            return
        now = time.monotonic()
        started = [a.alive_at for a in self._actors if a.alive]
        if not started or (now - actor.started < _START_S and now - min(started) < _BEHIND_S):
            return
        actor.in_hand.pop(chunk.token, None)
        self._send(chunk)  # to a started worker; a late reply of the first call is dropped
        if not actor.said:
            actor.said = True
            print(
                f"meshfeed: Ray record worker {actor.index} has not started yet; the "
                "others do its work until it does.",
                file=sys.stderr,
                flush=True,
            )

    def _redo(self, chunk: _Chunk, ref: Any, error: BaseException) -> None:
        """``chunk``'s call failed with its worker (or its rows were lost with a node)."""
        with self._lock:
            if chunk.ref is not ref:
                return  # sent again already (its worker was lost with others in hand)
            actor = chunk.actor
            if actor is not None and not actor.lost:
                self._lose(actor, error)
            if chunk.ref is ref:  # not among the lost worker's (its rows were lost after)
                if actor is not None:
                    actor.in_hand.pop(chunk.token, None)
                self._send(chunk)

    def _lose(self, actor: _Actor, error: BaseException) -> None:
        """Marks ``actor`` lost, starts one in its place, sends its chunks again."""
        name = actor.name(self._ray) if actor.alive else f"Ray record worker {actor.index}"
        actor.lost, actor.alive = True, False
        self._lost += 1
        with_it = list(actor.in_hand.values())
        actor.in_hand.clear()
        if not _gone(error):  # a worker that failed otherwise is stopped for good
            with contextlib.suppress(Exception):
                self._ray.kill(actor.handle, no_restart=True)
        self._start_actor()
        for chunk in with_it:
            self._send(chunk)
        print(
            f"meshfeed: {name} was lost ({type(error).__name__}); its {len(with_it)} chunks "
            "in hand are computed again on the other workers, and a new worker takes its "
            "place.",
            file=sys.stderr,
            flush=True,
        )

    def _check_left(self) -> None:
        """Raises once no worker has been alive for ``replace_s`` seconds."""
        if any(a.alive for a in self._actors):
            self._none_since = None
            return
        if self._lost == 0:
            return  # still starting the first ones: the timeout above bounds that
        now = time.monotonic()
        self._none_since = self._none_since or now
        if now - self._none_since > self.options.replace_s:
            raise RuntimeError(
                f"no Ray record worker is left: {self._lost} were lost, and none started in "
                f"their place within {self.options.replace_s:g} s. The cluster has no room "
                f"for a worker that reserves {self.options.cpus:g} CPUs"
                + (f" and {dict(self.options.resources)}" if self.options.resources else "")
                + "; add nodes, or lower RayOptions(cpus=..., resources=...)."
            )

    def release(self, ticket: RayTicket) -> None:
        """Drops a step never to be collected (its calls run; their replies are dropped)."""
        with self._lock:
            for chunk in ticket.chunks:
                if chunk.actor is not None:
                    chunk.actor.in_hand.pop(chunk.token, None)
                chunk.ref = None

    def pids(self) -> list[int]:
        """The pids of the workers alive now (waits for the ones starting)."""
        live = [a for a in self._actors if not a.lost]
        return [pid for pid, _ in self._ray.get([a.where for a in live])]

    def close(self) -> None:
        """Stops the workers. Safe to call twice."""
        self._finalizer()

    @staticmethod
    def _stop(ray: Any, actors: list[_Actor]) -> None:
        for actor in actors:
            if not actor.lost:
                with contextlib.suppress(Exception):  # Ray itself shut down first (at exit)
                    ray.kill(actor.handle, no_restart=True)


def _say_if_too_small(ray: Any, options: RayOptions, workers: int) -> None:
    """One line if the cluster, empty, cannot hold ``workers`` workers (an autoscaler may
    add nodes yet: the workers that fit do the others' work until then)."""
    wanted = {
        "CPU": options.cpus * workers,
        **{k: v * workers for k, v in options.resources.items()},
    }
    have = ray.cluster_resources()
    short = {k: (v, have.get(k, 0.0)) for k, v in wanted.items() if v > have.get(k, 0.0) + 1e-9}
    if short:
        print(
            f"meshfeed: {workers} Ray record workers need "
            + ", ".join(f"{v:g} {k}" for k, (v, _) in short.items())
            + ", but the Ray cluster has "
            + ", ".join(f"{h:g} {k}" for k, (_, h) in short.items())
            + "; the workers that fit do the work of the others until there is room.",
            file=sys.stderr,
            flush=True,
        )


def _gone(error: BaseException) -> bool:
    """Whether ``error`` says the worker is gone already (nothing to stop)."""
    return type(error).__name__ in ("ActorDiedError", "RayActorError", "NodeDiedError")
