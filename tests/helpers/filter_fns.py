"""Sources, predicates and record transforms for the filter tests; a module so that
worker processes and ``run_in_processes`` can import them by name."""

from __future__ import annotations

import os
import time
from typing import Any

import jax
import numpy as np

import meshfeed
from meshfeed.testing import local_shards

N = 300


def source(n: int = N, shift: int = 0) -> meshfeed.ArraySource:
    """``n`` examples: an id, a score in [0, 1) from it, and an 8-long row of the id."""
    ids = np.arange(n, dtype=np.int64)
    score = ((ids * 7919 + shift) % 1000) / 1000.0
    return meshfeed.ArraySource(
        {"id": ids, "score": score.astype(np.float32), "row": np.repeat(ids, 8).reshape(n, 8)}
    )


def high(record: dict[str, Any]) -> bool:
    """Keeps a third or so: score at least 0.6."""
    return bool(record["score"] >= 0.6)


def low(record: dict[str, Any]) -> bool:
    """Another predicate: score under 0.3."""
    return bool(record["score"] < 0.3)


def slow_high(record: dict[str, Any]) -> bool:
    """``high``, a millisecond a record: a select that can be killed half way."""
    time.sleep(0.001)
    return high(record)


def busy_high(record: dict[str, Any]) -> bool:
    """``high``, ~10 us of work a record: enough that ``select`` takes its workers."""
    return sum(range(200)) > 0 and high(record)


def fails_on_17(record: dict[str, Any]) -> bool:
    if int(record["id"]) == 17:
        raise ValueError("no score for this one")
    return high(record)


def drop_thirds(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any] | None:
    """A record transform that drops every example whose id is a multiple of 3."""
    if int(record["id"]) % 3 == 0:
        return None
    return {"id": record["id"], "row": record["row"] * 2 + rng.integers(0, 2, 8)}


def drop_below(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any] | None:
    """Drops ids under 40: every row of the first steps of an ordered loader."""
    if int(record["id"]) < 40:
        return None
    return {"id": record["id"]}


def drop_all(record: dict[str, Any], rng: np.random.Generator) -> None:
    return None


def selected_stream(cache: str, state: dict[str, Any] | None, take: int) -> dict[str, Any]:
    """A loader over ``select(source(), high)``: this process's shards of every batch of
    two epochs from ``state`` (or the start), and the state after ``take`` of them."""
    selection = meshfeed.select(source(), high, workers=0, cache_dir=cache, progress=False)
    mesh = meshfeed.make_mesh(data=jax.device_count())
    loader = meshfeed.Loader(
        selection, global_batch_size=8, sharding=meshfeed.batch_sharding(mesh), seed=5,
        num_epochs=2, last_batch="pad",
    )  # fmt: skip
    if state is not None:
        loader.restore(state)
    batches, taken = [], None
    for k, batch in enumerate(loader):
        batches.append({n: (x.shape, local_shards(x)) for n, x in batch.items()})
        if k + 1 == take:
            taken = loader.state()
    return {"batches": batches, "state": taken, "steps_per_epoch": loader.steps_per_epoch}


def slow_high_noted(record: dict[str, Any]) -> bool:
    """``slow_high``, noting the process that ran it: a file named by its pid in the
    folder ``$FILTER_PIDS``."""
    folder = os.environ["FILTER_PIDS"]
    if not os.path.exists(f"{folder}/{os.getpid()}"):
        open(f"{folder}/{os.getpid()}", "w").close()
    return slow_high(record)


def slow_low_noted(record: dict[str, Any]) -> bool:
    """Another predicate noting its process (``slow_high_noted``)."""
    slow_high_noted(record)
    return low(record)


def fails_in_a_worker(record: dict[str, Any]) -> bool:
    """Raises in any process but ``$FILTER_PARENT`` (a millisecond a record before)."""
    time.sleep(0.001)
    if os.getpid() != int(os.environ["FILTER_PARENT"]):
        raise ValueError("not in this process")
    return high(record)
