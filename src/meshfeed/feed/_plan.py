"""The planner: what each strategy costs for a given sharding, shape and process count.

For every strategy and every process: the rows it asks the source for per step, the
bytes those rows weigh, the bytes it copies from host to its devices, and (for
``reshard``) the bytes devices then move between them. All of it follows from
``sharding.devices_indices_map`` and which process owns each device, so it can be
computed anywhere -- also for a process count that is not running here (``processes=``).
``"auto"`` chooses from these numbers and says why.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from meshfeed.core._mesh import axes_across_processes, process_map
from meshfeed.data._sources import FieldSpec, field_text
from meshfeed.feed._timeline import Span

Strategy = Literal["global", "per_device", "per_process", "reshard", "auto"]
"""How a ``Loader`` builds each global batch (the strategies guide): one of
``STRATEGIES``."""
CONCRETE: tuple[Strategy, ...] = ("global", "per_device", "per_process", "reshard")
STRATEGIES: tuple[Strategy, ...] = (*CONCRETE, "auto")
"""Every ``Strategy`` a ``Loader`` accepts: the four that build batches, and ``"auto"``."""
Field = tuple[NamedSharding, tuple[int, ...], np.dtype]  # sharding, per-example shape, dtype


@dataclasses.dataclass(frozen=True)
class Cost:
    """One strategy's cost per step, per process (bytes and rows)."""

    strategy: str
    rows_read: dict[int, int]
    bytes_read: dict[int, int]
    host_to_device: dict[int, int]
    device_to_device: int  # over all devices, per step


@dataclasses.dataclass(frozen=True)
class Fetches:
    """What the steps of a source behind a URL ask the store for, on this process: range
    requests and bytes (gaps between nearby rows included), per step, averaged over the
    ``steps`` next steps of the loader."""

    url: str
    steps: int
    requests: float
    bytes: float

    @classmethod
    def sample(cls, url: str, per_step: Sequence[tuple[int, int]]) -> Fetches:
        """From ``(requests, bytes)`` of each sampled step."""
        n = max(1, len(per_step))
        return cls(
            url, len(per_step), sum(r for r, _ in per_step) / n, sum(b for _, b in per_step) / n
        )


@dataclasses.dataclass(frozen=True)
class PodCost:
    """What ``processes`` hosts ask of the store behind a dataset: one host's requests
    before its first data read (by kind, as counted opening it here), its requests and
    bytes per step (the mean of the ``steps`` first steps, its share of each batch), and
    what that comes to for the pod at the store's rate, ``store_rps`` requests a second."""

    url: str
    processes: int
    startup: dict[str, int]
    step_requests: float
    step_bytes: float
    steps: int
    store_rps: float
    files: int | None = None
    """Files the data is stored in (``None``: not known)."""
    first_read: int | None = None
    """Requests a file's first read costs a host before its data (its sidecar index, a
    header; ``None``: not measured, local data)."""

    @property
    def host_first_reads(self) -> int | None:
        """One host's first-read requests when it touches every file (a global shuffle
        does, within its first epoch)."""
        if self.files is None or self.first_read is None:
            return None
        return self.files * self.first_read

    @property
    def startup_requests(self) -> int:
        """One host's requests before its first data read."""
        return sum(self.startup.values())

    @property
    def pod_startup_requests(self) -> int:
        """Every host's start-up requests together, which the store serves before the
        pod's first step."""
        return self.processes * self.startup_requests

    @property
    def startup_seconds(self) -> float:
        """The pod's start-up requests at the store's rate."""
        return self.pod_startup_requests / self.store_rps

    @property
    def pod_step_requests(self) -> float:
        """Every host's requests of one step, together."""
        return self.processes * self.step_requests

    @property
    def step_seconds(self) -> float:
        """Seconds of the store's rate that one step's requests take, every host's
        together; a step faster than this waits on the store (or needs one that serves
        more)."""
        return self.pod_step_requests / self.store_rps


@dataclasses.dataclass(frozen=True)
class Plan:
    """The costs of every strategy, and the one a loader uses (or ``"auto"`` picks)."""

    costs: dict[str, Cost]
    choice: str
    reason: str
    requested: str
    global_batch_size: int
    processes: int
    fields: dict[str, str]
    fetches: Fetches | None = None  # for a source behind a URL: a step's requests
    pod: PodCost | None = None  # with data and processes: what the pod asks of the store
    schedule: tuple[Span, ...] = ()
    """The spans of steps ahead of a loader with stages (a batch size that ramps, a
    mixture's weights), and what holds in each."""
    across_processes: tuple[str, ...] = ()
    """The mesh axes that cross processes (their collectives leave the host), for the
    processes planned for."""

    @property
    def strategy(self) -> str:
        """The strategy in use, the one requested or auto's choice."""
        return self.choice if self.requested == "auto" else self.requested

    @property
    def summary(self) -> str:
        """One line that names the strategy in use, and why (or what ``"auto"`` would pick)."""
        if self.requested == "auto":
            return f"auto -> {self.choice}: {self.reason}"
        return f"strategy={self.requested!r} (auto would pick {self.choice}: {self.reason})"

    def __str__(self) -> str:
        return self.summary


def load_sharding(sharding: NamedSharding, global_batch_size: int) -> NamedSharding:
    """The layout ``reshard`` loads in: the batch over every mesh axis, no replication,
    or the target's batch axes when the batch does not split into one block per device."""
    mesh = sharding.mesh
    if global_batch_size % mesh.size == 0:
        return NamedSharding(mesh, P(tuple(mesh.axis_names)))
    return NamedSharding(mesh, P(sharding.spec[0] if len(sharding.spec) else None))


def _blocks(sharding: NamedSharding, shape: tuple[int, ...]) -> dict[Any, tuple[Any, ...]]:
    return {
        d: tuple(s.indices(n)[:2] for s, n in zip(index, shape, strict=True))
        for d, index in sharding.devices_indices_map(shape).items()
    }


def _size(block: tuple[Any, ...]) -> int:
    return math.prod(b - a for a, b in block)


def _overlap(x: tuple[Any, ...], y: tuple[Any, ...]) -> int:
    return math.prod(
        max(0, min(b1, b2) - max(a1, a2)) for (a1, b1), (a2, b2) in zip(x, y, strict=True)
    )


def costs(
    fields: Mapping[str, Field], global_batch_size: int, *, processes: int | None = None
) -> tuple[dict[str, Cost], dict[int, int]]:
    """Every concrete strategy's cost, and the rows each process needs (per_process)."""
    b = global_batch_size
    example_bytes = sum(
        math.prod(shape) * np.dtype(dtype).itemsize for _, shape, dtype in fields.values()
    )
    first = next(iter(fields.values()))[0]
    owner = process_map(list(np.asarray(first.mesh.devices).flat), processes)
    procs = sorted(set(owner.values()))

    target = {n: _blocks(s, (b, *shape)) for n, (s, shape, _) in fields.items()}
    loaded = {n: _blocks(load_sharding(s, b), (b, *shape)) for n, (s, shape, _) in fields.items()}
    itemsize = {n: np.dtype(dtype).itemsize for n, (_, _, dtype) in fields.items()}

    def rows(blocks: Mapping[str, Mapping[Any, tuple[Any, ...]]], device: Any) -> set[int]:
        return {r for f in blocks for r in range(*blocks[f][device][0])}

    out: dict[str, Cost] = {}
    needed: dict[int, int] = {}
    for strategy in CONCRETE:
        read: dict[int, int] = {}
        h2d: dict[int, int] = {}
        for p in procs:
            devices = [d for d, q in owner.items() if q == p]
            blocks = loaded if strategy == "reshard" else target
            if strategy == "global":
                read[p] = b
            elif strategy == "per_device":
                read[p] = sum(len(rows(blocks, d)) for d in devices)
            else:
                read[p] = len(set().union(*(rows(blocks, d) for d in devices)))
            h2d[p] = sum(_size(blocks[f][d]) * itemsize[f] for f in blocks for d in devices)
        moved = 0
        if strategy == "reshard":
            for f in fields:
                for d, block in target[f].items():
                    moved += (_size(block) - _overlap(block, loaded[f][d])) * itemsize[f]
        out[strategy] = Cost(
            strategy, read, {p: r * example_bytes for p, r in read.items()}, h2d, moved
        )
        if strategy == "per_process":
            needed = read
    return out, needed


def choose(needed: Mapping[int, int], global_batch_size: int) -> tuple[str, str]:
    """The strategy ``"auto"`` picks from the rows each process needs, and why."""
    b = global_batch_size
    if len(needed) == 1:
        return "per_process", (
            "one process: per_process reads each row of the batch once, in one gather, "
            "and places it with one transfer per field."
        )
    if all(r == b for r in needed.values()):
        return "global", (
            f"each of the {len(needed)} processes needs all {b} rows (the batch is "
            "replicated across processes), so every strategy reads the whole batch; "
            "global does it with the least bookkeeping."
        )
    total = sum(needed.values())
    note = (
        f" Replica groups span processes, so {total - b} rows are read more than once; "
        "'reshard' would read each row once and move them between devices instead."
        if total > b
        else ""
    )
    counts = sorted(set(needed.values()))
    each = str(counts[0]) if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"
    return "per_process", (
        f"each of the {len(needed)} processes reads {each} of the {b} rows, only those its "
        f"devices hold.{note}"
    )


def make_plan(
    fields: Mapping[str, Field],
    global_batch_size: int,
    *,
    requested: str = "auto",
    processes: int | None = None,
) -> Plan:
    table, needed = costs(fields, global_batch_size, processes=processes)
    mesh = next(iter(fields.values()))[0].mesh
    choice, reason = choose(needed, global_batch_size)
    return Plan(
        costs=table,
        choice=choice,
        reason=reason,
        requested=requested,
        global_batch_size=global_batch_size,
        processes=len(needed),
        fields={n: field_text(FieldSpec(s, d)) for n, (_, s, d) in fields.items()},
        across_processes=(
            axes_across_processes(mesh, processes=processes) if isinstance(mesh, Mesh) else ()
        ),
    )
