"""Record transforms for the tests; module level so worker processes can import them."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

import numpy as np

import meshfeed

CROP = 24


def crop(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """A random 24x24 crop and a random flip: depends on the example's rng only."""
    i, j = rng.integers(0, 28 - CROP + 1, 2)
    image = record["image"][i : i + CROP, j : j + CROP]
    if rng.random() < 0.5:
        image = image[:, ::-1]
    return {"image": image.astype(np.float32) / 255.0, "label": record["label"]}


def fails_on_17(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    if int(record["label"]) == 17:
        raise ValueError("cannot decode example 17")
    return crop(record, rng)


def dies_on_17(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    if int(record["label"]) == 17:
        os.kill(os.getpid(), signal.SIGKILL)
    return crop(record, rng)


def slow(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    time.sleep(0.01)
    return crop(record, rng)


def changes_shape(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    size = 20 if int(record["label"]) == 5 else CROP
    return {"image": record["image"][:size, :size], "label": record["label"]}


def source(n: int = 100) -> meshfeed.ArraySource:
    rng = np.random.default_rng(0)
    return meshfeed.ArraySource(
        {
            "image": rng.integers(0, 256, (n, 28, 28), dtype=np.uint8),
            "label": np.arange(n, dtype=np.int32),
        }
    )


def dies_saying_why_on_17(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """Writes its last words (with the time) to stderr, then exits at once."""
    if int(record["label"]) == 17:
        print(f"the decoder gave up at {time.time():.6f}", file=sys.stderr, flush=True)
        os._exit(3)
    return crop(record, rng)


def stream(
    fn: Any, num_workers: int, layout: str = "data8", worker_type: str = "processes"
) -> list[dict[str, Any]]:
    """Every batch of one padded epoch, as this process's shards."""
    from layouts import make_layout
    from meshfeed.testing import local_shards

    loader = meshfeed.Loader(
        source(),
        global_batch_size=16,
        sharding=make_layout(layout)["label"],
        record_transform=fn,
        num_workers=num_workers,
        worker_type=worker_type,  # type: ignore[arg-type]
        last_batch="pad",
        seed=7,
    )
    try:
        return [{k: (v.shape, local_shards(v)) for k, v in b.items()} for b in loader]
    finally:
        loader.close()


def copy_rows(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """The record as it is, copied: only the pipeline's own work."""
    return {name: np.array(value) for name, value in record.items()}
