"""What the object-storage tests run in each process (importable by name)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax

import meshfeed
from meshfeed.testing import local_shards


def make_loader(source: Any, global_batch_size: int = 8, **kwargs: Any) -> meshfeed.Loader:
    """The tests' loader of ``source``: seed 3, padded last batch, a data mesh of every device."""
    return meshfeed.Loader(
        source,
        global_batch_size=global_batch_size,
        sharding=meshfeed.batch_sharding(meshfeed.make_mesh(data=jax.device_count())),
        seed=3,
        last_batch="pad",
        **kwargs,
    )


def stream(source: Any, **kwargs: Any) -> list[dict[str, Any]]:
    """Every batch of one shuffled epoch of ``source``, as this process's shards."""
    return [
        {k: (v.shape, local_shards(v)) for k, v in b.items()} for b in make_loader(source, **kwargs)
    ]


def stream_from(
    url: str, storage_options: Mapping[str, Any], orders: Sequence[Mapping[str, Any]]
) -> list[list[dict[str, Any]]]:
    """``stream`` of the meshfeed folder at ``url`` (on the test's S3 server), once with
    each of ``orders`` (loader arguments), each from a source opened anew."""
    return [
        stream(meshfeed.open_source(url, storage_options=storage_options), **order)
        for order in orders
    ]


def read_until_gone(
    url: str, storage_options: Mapping[str, Any], flags: str, retry_s: float
) -> tuple[str, float, float]:
    """Reads a step (32 rows, a few steps read ahead), says so (a file in ``flags``),
    waits until the test has taken the store away (the file ``stopped`` holds when),
    then reads on: the error this process raises, the seconds from the store going away
    to it, and the requests a step sends from this process."""
    source = meshfeed.open_source(url, storage_options=storage_options, retry_s=retry_s)
    loader = make_loader(source, global_batch_size=32, prefetch=2)
    fetches = loader.plan.fetches
    per_step = fetches.requests if fetches is not None else 0.0
    batches = iter(loader)
    next(batches)
    open(os.path.join(flags, f"ready-{jax.process_index()}"), "w").close()
    stopped = Path(flags, "stopped")  # written whole (renamed into place)
    while not stopped.exists():
        time.sleep(0.05)
    went = float(stopped.read_text())
    try:
        for _ in batches:
            pass
    except OSError as error:
        return str(error), time.time() - went, per_step
    return "no error", time.time() - went, per_step
