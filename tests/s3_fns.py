"""What the object-storage tests run in each process (importable by name)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import jax

import meshfeed
from meshfeed.testing import local_shards


def _loader(source: Any, **kwargs: Any) -> meshfeed.Loader:
    return meshfeed.Loader(
        source,
        global_batch_size=8,
        sharding=meshfeed.batch_sharding(meshfeed.make_mesh(data=jax.device_count())),
        seed=3,
        last_batch="pad",
        **kwargs,
    )


def stream(source: Any, **kwargs: Any) -> list[dict[str, Any]]:
    """Every batch of one shuffled epoch of ``source``, as this process's shards."""
    return [
        {k: (v.shape, local_shards(v)) for k, v in b.items()} for b in _loader(source, **kwargs)
    ]


def stream_from(
    url: str, storage_options: Mapping[str, Any], order: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """``stream`` of the meshfeed folder at ``url`` (on the test's S3 server), with the
    loader arguments ``order``."""
    return stream(meshfeed.open_source(url, storage_options=storage_options), **order)


def read_until_gone(url: str, storage_options: Mapping[str, Any], flags: str) -> tuple[str, float]:
    """Reads a step, says so (a file in ``flags``), waits until the test has taken the
    store away, then reads on: the error each process raises, and how long it took."""
    source = meshfeed.open_source(url, storage_options=storage_options, retry_s=2)
    batches = iter(_loader(source, prefetch=0))
    next(batches)
    open(os.path.join(flags, f"ready-{jax.process_index()}"), "w").close()
    while not os.path.exists(os.path.join(flags, "stopped")):
        time.sleep(0.05)
    start = time.monotonic()
    try:
        for _ in batches:
            pass
    except OSError as error:
        return str(error), time.monotonic() - start
    return "no error", time.monotonic() - start
