"""A loader with both schedules (weights by stage and a batch size that ramps), for the
schedule tests. Importable by the processes ``run_in_processes`` starts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

import meshfeed
import multiprocess_fns
from meshfeed.testing import local_shards

WEIGHTS = [(0, [0.8, 0.2]), (6, [0.3, 0.7], 4), (14, [0.5, 0.5])]
"""Stage 0 to step 5, a blend over steps 6 to 9, the second stage 10 to 13, then even."""
SIZES = [(0, 16), (8, 32), (16, 64)]
LENGTH = 1024  # 8 x 16 + 8 x 32 + 10 x 64 positions: 26 steps


def tagged(tag: int, n: int) -> meshfeed.ArraySource:
    """A source whose rows say where they came from: ``src`` (the tag) and ``id``."""
    return meshfeed.ArraySource(
        {"src": np.full(n, tag, np.int32), "id": np.arange(n, dtype=np.int32)}
    )


def loader(weights: Any = WEIGHTS, sizes: Any = SIZES, **options: Any) -> meshfeed.Loader:
    mixture = meshfeed.mix([tagged(0, 300), tagged(1, 120)], weights, length=LENGTH, seed=3)
    return meshfeed.Loader(
        mixture,
        global_batch_size=sizes,
        sharding=meshfeed.batch_sharding(meshfeed.make_mesh(data=jax.device_count())),
        **{"shuffle": False, "prefetch": 2, **options},
    )


Shards = dict[str, tuple[tuple[int, ...], list[Any]]]


def _shards(batch: Mapping[str, jax.Array]) -> Shards:
    return {name: (x.shape, local_shards(x)) for name, x in batch.items()}


def record_run() -> dict[str, Any]:
    """The whole run: every batch's local shards, and the state after each step."""
    stream = loader()
    batches, states = [], []
    for batch in stream:
        batches.append(_shards(batch))
        states.append(stream.state())
    return {"batches": batches, "states": states}


def continue_from(states: list[dict[str, Any]], steps: int) -> list[list[Shards]]:
    """For each state: a fresh loader restored there, and its next ``steps`` batches."""
    out = []
    for state in states:
        stream = loader()
        stream.restore(state)
        out.append([_shards(b) for _, b in zip(range(steps), stream, strict=False)])
    return out


def assemble(per_process: list[list[Shards]]) -> list[dict[str, np.ndarray]]:
    """Global numpy batches from each process's local shards of the same steps."""
    return multiprocess_fns.assemble([{"batches": batches} for batches in per_process])


PLAIN = 816  # 21 steps of 16, then whole steps of 24 or of 8


def plain(size: Any) -> meshfeed.Loader:
    """A shuffled loader over ``PLAIN`` ids, ``size`` rows a step."""
    return meshfeed.Loader(
        meshfeed.ArraySource({"id": np.arange(PLAIN, dtype=np.int32)}),
        global_batch_size=size,
        sharding=meshfeed.batch_sharding(meshfeed.make_mesh(data=jax.device_count())),
        seed=3,
        prefetch=2,
    )


def resumed(state: dict[str, Any], size: int) -> list[Shards]:
    """A fresh ``plain(size)`` restored at ``state``: every batch left in its pass."""
    stream = plain(size)
    stream.restore(state)
    return [_shards(b) for b in stream]
