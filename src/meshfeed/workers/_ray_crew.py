"""The Ray actors of one ``RayWorkers``: started, seen to start, lost and replaced.

``Crew`` holds the actors and what they reserve. ``pick`` gives the live one with the
least in hand (started ones first); ``lose`` marks one lost (its process killed, its
node gone), starts one in its place and hands back the chunks it had, to be sent again;
``stuck`` says whether a chunk waits on an actor that has not started while others have
(the cluster had no room for it, or it starts slowly); ``check_left`` raises once no
actor has been alive for ``RayOptions.replace_s`` seconds. Each event is one line on
stderr. The caller holds its lock around every call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from typing import Any

import numpy as np

from meshfeed.cluster._ray_connect import RayOptions

START_S = 10.0  # a worker not started by then has its chunks done by the others,
BEHIND_S = 3.0  # as has one not started this long after another did


@dataclasses.dataclass(eq=False)
class Chunk:
    """One chunk of a step: its key (``token``), its rows, the call computing it."""

    token: int
    lo: int
    ids: np.ndarray
    spec: dict[str, Any]
    seed: int
    epoch: int
    ref: Any = None
    actor: Actor | None = None


@dataclasses.dataclass(eq=False)
class Actor:
    """One Ray actor, and the chunks it has in hand."""

    index: int
    handle: Any
    where: Any  # the ref of its (pid, node id)
    started: float
    in_hand: dict[int, Chunk] = dataclasses.field(default_factory=dict)
    alive: bool = False  # it answered ``where``
    lost: bool = False
    said: bool = False  # that it has not started
    alive_at: float = 0.0
    spec: dict[str, Any] | None = None  # the output fields it was last sent (it keeps them)

    def name(self, ray: Any) -> str:
        if not self.alive:
            return f"Ray record worker {self.index} (not yet started)"
        pid, node = ray.get(self.where)
        return f"Ray record worker {self.index} (pid {pid} on node {node[:12]})"


class Crew:
    """The actors of ``ray_class`` made with ``init`` (the module docstring)."""

    def __init__(
        self, ray: Any, ray_class: Any, init: tuple[Any, ...], options: RayOptions
    ) -> None:
        self._ray = ray
        self._class = ray_class
        self._init = init
        self.options = options
        self.actors: list[Actor] = []
        self.lost = 0
        self._none_since: float | None = None

    def start(self) -> Actor:
        handle = self._class.remote(*self._init)
        actor = Actor(len(self.actors), handle, handle.where.remote(), time.monotonic())
        self.actors.append(actor)
        return actor

    def pick(self) -> Actor:
        """The live actor with the least in hand, started ones first."""
        self.check_started()
        live = [a for a in self.actors if not a.lost]
        return min(live, key=lambda a: (not a.alive, len(a.in_hand)))

    def check_started(self) -> list[Chunk]:
        """Notes the actors that have started; returns the chunks of those that died
        before they did (``lose``), to be sent again."""
        waiting = [a for a in self.actors if not a.lost and not a.alive]
        again: list[Chunk] = []
        if waiting:
            refs = [a.where for a in waiting]
            ready = set(self._ray.wait(refs, num_returns=len(refs), timeout=0)[0])
            for actor in waiting:
                if actor.where in ready:
                    try:
                        self._ray.get(actor.where)
                        actor.alive, actor.alive_at = True, time.monotonic()
                    except Exception as error:  # it died before it started
                        again += self.lose(actor, error)
        return again

    def stuck(self, chunk: Chunk) -> bool:
        """Whether ``chunk`` waits on an actor not started while others are (said once
        per actor); the caller sends it again, to a started one."""
        actor = chunk.actor
        if actor is None or actor.alive or actor.lost:
            return False
        now = time.monotonic()
        started = [a.alive_at for a in self.actors if a.alive]
        if not started or (now - actor.started < START_S and now - min(started) < BEHIND_S):
            return False
        actor.in_hand.pop(chunk.token, None)
        if not actor.said:
            actor.said = True
            print(
                f"meshfeed: Ray record worker {actor.index} has not started yet; the "
                "others do its work until it does.",
                file=sys.stderr,
                flush=True,
            )
        return True

    def lose(self, actor: Actor, error: BaseException) -> list[Chunk]:
        """Marks ``actor`` lost and starts one in its place; returns its chunks."""
        name = actor.name(self._ray) if actor.alive else f"Ray record worker {actor.index}"
        actor.lost, actor.alive = True, False
        self.lost += 1
        with_it = list(actor.in_hand.values())
        actor.in_hand.clear()
        if not _gone(error):  # a worker that failed otherwise is stopped for good
            with contextlib.suppress(Exception):
                self._ray.kill(actor.handle, no_restart=True)
        self.start()
        print(
            f"meshfeed: {name} was lost ({type(error).__name__}); its {len(with_it)} chunks "
            "in hand are computed again on the other workers, and a new worker takes its "
            "place.",
            file=sys.stderr,
            flush=True,
        )
        return with_it

    def check_left(self) -> None:
        """Raises once no worker has been alive for ``replace_s`` seconds."""
        if any(a.alive for a in self.actors):
            self._none_since = None
            return
        if self.lost == 0:
            return  # still starting the first ones: the caller's timeout bounds that
        now = time.monotonic()
        self._none_since = self._none_since or now
        if now - self._none_since > self.options.replace_s:
            raise RuntimeError(
                f"no Ray record worker is left: {self.lost} were lost, and none started in "
                f"their place within {self.options.replace_s:g} s. The cluster has no room "
                f"for a worker that reserves {self.options.cpus:g} CPUs"
                + (f" and {dict(self.options.resources)}" if self.options.resources else "")
                + "; add nodes, or lower RayOptions(cpus=..., resources=...)."
            )

    @staticmethod
    def stop(ray: Any, actors: list[Actor]) -> None:
        """Stops every actor not lost (at close, or at exit)."""
        for actor in actors:
            if not actor.lost:
                with contextlib.suppress(Exception):  # Ray itself shut down first (at exit)
                    ray.kill(actor.handle, no_restart=True)


def say_if_too_small(ray: Any, options: RayOptions, workers: int) -> None:
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
