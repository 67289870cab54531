"""Loaders for the tests of worker_type="ray"; module level so Ray workers and test
processes import them by name."""

from __future__ import annotations

import os
import time
from typing import Any

import jax
import numpy as np

import meshfeed
from meshfeed.testing import local_shards

N, BATCH = 300, 32
ON_WORKER_NODES = meshfeed.types.RayOptions(cpus=0.5, resources={"records": 1})
"""What the tests' Ray workers reserve: a share of a worker node (the head has none)."""


def decode(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """A random crop and noise: depends on the example, the seed and the epoch only."""
    i, j = rng.integers(0, 5, 2)
    image = record["image"][i : i + 8, j : j + 8].astype(np.float32)
    return {"image": image + rng.random((8, 8), dtype=np.float32), "label": record["label"]}


def crop(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """A fixed crop that never raises (for sources whose reads do)."""
    del rng
    return {"image": record["image"][:8, :8].astype(np.float32), "label": record["label"]}


def flat_decode(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """``decode`` of an image stored flat (as a Parquet list column of 144) or not."""
    return decode({**record, "image": record["image"].reshape(12, 12)}, rng)


def slow_decode(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """``decode``, slowed down so that chunks are in a worker's hands when it is lost."""
    time.sleep(0.002)
    return decode(record, rng)


def whose(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """The label and the pid of the worker that computed it (cheap: ~10 us a record)."""
    del rng
    return {"label": record["label"], "pid": np.int32(os.getpid())}


def slow_whose(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """``whose``, at 3 ms a record."""
    time.sleep(0.003)
    return whose(record, rng)


def source(n: int = N) -> meshfeed.ArraySource:
    rng = np.random.default_rng(0)
    return meshfeed.ArraySource(
        {
            "image": rng.integers(0, 256, (n, 12, 12), dtype=np.uint8),
            "label": np.arange(n, dtype=np.int32),
        }
    )


def loader(fn: Any = decode, *, data: Any = None, **kwargs: Any) -> meshfeed.Loader:
    mesh = meshfeed.make_mesh(data=jax.device_count())
    options: dict[str, Any] = {
        "global_batch_size": BATCH,
        "sharding": meshfeed.batch_sharding(mesh),
        "seed": 11,
        "num_epochs": 2,
        "last_batch": "pad",
        "record_transform": fn,
        **kwargs,
    }
    return meshfeed.Loader(source() if data is None else data, **options)


def local(batch: dict[str, Any]) -> dict[str, Any]:
    """This process's shards of a batch, as numpy (what ``assemble`` puts together)."""
    return {k: (v.shape, local_shards(v)) for k, v in batch.items()}


def shards(**kwargs: Any) -> list[dict[str, Any]]:
    """This process's shards of every batch of a loader built with ``kwargs``."""
    feed = loader(**kwargs)
    try:
        return [local(b) for b in feed]
    finally:
        feed.close()
