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


class DecodesInChunks:
    """A record transform with a batch form (``BatchedRecordFn``), as a decoder of a
    chunk of records is: ``prepare`` draws each record's crop, ``batch`` cuts the chunk.
    Its batch raises on a chunk that holds example ``bad`` without saying which record
    is at fault; with ``alone_ok``, only on a chunk of more than one record (a batch form
    that breaks where each record alone works)."""

    def __init__(self, bad: int, *, alone_ok: bool = False) -> None:
        self.bad, self.alone_ok = bad, alone_ok

    def __call__(self, record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        return self.batch([record], [self.prepare(record, rng)])[0]

    def prepare(self, record: dict[str, Any], rng: np.random.Generator) -> Any:
        i, j = rng.integers(0, 28 - CROP + 1, 2)
        return int(i), int(j), bool(rng.random() < 0.5)

    def batch(self, records: list[dict[str, Any]], prepared: list[Any]) -> list[dict[str, Any]]:
        at_fault = any(int(r["label"]) == self.bad for r in records)
        if at_fault and not (self.alone_ok and len(records) == 1):
            raise ValueError(f"cannot decode a record of this chunk of {len(records)}")
        out = []
        for record, (i, j, flip) in zip(records, prepared, strict=True):
            image = record["image"][i : i + CROP, j : j + CROP]
            image = image[:, ::-1] if flip else image
            out.append({"image": image.astype(np.float32) / 255.0, "label": record["label"]})
        return out


def make_loader(
    fn: Any, num_workers: int, layout: str = "data8", worker_type: str = "processes", **options: Any
) -> meshfeed.Loader:
    """A padded epoch of ``source()`` through ``fn``, 16 rows a step."""
    from layouts import make_layout

    return meshfeed.Loader(
        source(),
        global_batch_size=16,
        sharding=make_layout(layout)["label"],
        record_transform=fn,
        num_workers=num_workers,
        worker_type=worker_type,  # type: ignore[arg-type]
        last_batch="pad",
        seed=7,
        **options,
    )


def stream(
    fn: Any, num_workers: int, layout: str = "data8", worker_type: str = "processes"
) -> list[dict[str, Any]]:
    """Every batch of one padded epoch, as this process's shards."""
    from meshfeed.testing import local_shards

    loader = make_loader(fn, num_workers, layout, worker_type)
    try:
        return [{k: (v.shape, local_shards(v)) for k, v in b.items()} for b in loader]
    finally:
        loader.close()


def copy_rows(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """The record as it is, copied: only the pipeline's own work."""
    return {name: np.array(value) for name, value in record.items()}


def writes_its_record(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """Adds 1 to its record's row in place and returns a copy: a transform that writes
    to its input must not change what a later epoch reads."""
    record["image"] += 1
    return {"image": record["image"].copy(), "label": record["label"]}
