"""Workload IS: an image folder on moto's S3 server against its images sharded by shard_images."""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import s3fs
from harness import arguments, emit, in_rounds, median_ratio
from remote_fns import figures, in_child, loader, s3_store
from vision import write_folder

import meshfeed
from meshfeed.vision import shard_images

BATCH = 256
LATENCY_S = 0.030
PART_BYTES = 8 << 20  # moto reads a whole object to answer a range of it
SIZES = {"imagenet": (375, 500), "small": (120, 160)}  # height, width; noise 10: ~69 KB, ~8 KB
READERS = ["folder", "shards", "folder-2", "shards-2"]


def _keep_size(record: dict[str, Any], rng: Any) -> dict[str, Any]:
    return {"size": np.int64(len(record["image"])), "label": record["label"]}


def _read(which: str, options: dict[str, Any], seconds: float, warmup: float) -> dict[str, Any]:
    """Reads ``which`` for ``seconds`` after ``warmup``: its images/s and requests a step
    (in a process of its own, so that the proxy's threads do not share its interpreter)."""
    if which.startswith("folder"):
        source: Any = meshfeed.ImageFolderSource("s3://data/train", storage_options=options)
        order: dict[str, Any] = {}
    else:
        source = meshfeed.open_source("s3://data/shards", storage_options=options)
        order = {"shuffle_block": 64, "shuffle_window": 4}
    if which.endswith("-2"):
        order["prefetch"] = 2
    fed = loader(source, BATCH, record_transform=_keep_size, **order)
    batches = iter(fed)
    start = time.perf_counter()
    next(batches)
    while time.perf_counter() - start < warmup:  # past the read-ahead's fill
        next(batches)
    requests = getattr(source, "requests", None)  # the shards count theirs
    steps = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or steps < 2:
        next(batches)
        steps += 1
    elapsed = time.perf_counter() - start
    asked = None if requests is None else (source.requests - requests) / steps
    fed.close()
    return {"images_per_s": steps * BATCH / elapsed, "requests_per_step": asked}


def _case(kind: str, count: int, args: argparse.Namespace, work: Path) -> None:
    root = write_folder(work / kind / "train", count, *SIZES[kind], noise=10.0)
    mean_kb = round(sum(p.stat().st_size for p in root.rglob("*.jpg")) / count / 1e3, 1)
    # devices: the readers'; this process never starts JAX
    head = {"smoke": args.smoke, "devices": 8, "processes": 1, "workload": "IS", "images": kind}
    sizes = {"count": count, "mean_kb": mean_kb, "latency_ms": LATENCY_S * 1e3}
    with s3_store() as (server, proxy, held):
        fs = s3fs.S3FileSystem(**server.storage_options)
        fs.put(str(root), "s3://data/train", recursive=True)
        for request in ("range", "get", "head", "list"):
            proxy.hold(request, 1.0, LATENCY_S)
        start = time.perf_counter()  # shard_images' own rate, from the store to the store
        options = {"part_bytes": args.part_bytes, "storage_options": held, "progress": False}
        status = shard_images("s3://data/train", "s3://data/shards", workers=2, **options)
        rate = round(count / (time.perf_counter() - start), 1)
        shard = {"parts": status.parts, "part_bytes": args.part_bytes, "images_per_s": rate}
        emit("image_store", **head, what="shard_images", **sizes, **shard, workers=2)
        entries = {n: partial(in_child, _read, n, held, args.seconds, args.warmup) for n in READERS}
        per_round = in_rounds(entries, args.rounds, pause=0)
    for name in READERS:
        keys = {"images_per_s": 1, "requests_per_step": 1}
        if name.startswith("folder"):  # a request an image: not counted
            keys = {"images_per_s": 1}
        got = {"requests_per_step": None, **figures(per_round, name, keys)}
        line = {**sizes, "batch": BATCH, **got, "rounds": args.rounds, "cpus": os.cpu_count()}
        emit("image_store", **head, what=name, **line)
    for name in ("shards", "shards-2"):
        peer = name.replace("shards", "folder")
        ratios = [round(r[name]["images_per_s"] / r[peer]["images_per_s"], 2) for r in per_round]
        ratio = median_ratio(per_round, name, peer, "images_per_s", digits=2)
        emit("image_store", **head, what=f"{name}/{peer}", ratio=ratio, ratios=ratios, goal=10.0)


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--part-bytes", type=int, default=PART_BYTES, help="shard_images'")
    parser.add_argument("--warmup", type=float, default=8.0, help="seconds read before timing")
    parser.add_argument("--images", choices=[*SIZES, "all"], default="all")


def main() -> None:
    smoke = {"rounds": 1, "seconds": 0.3, "warmup": 0.0, "part_bytes": PART_BYTES}
    args = arguments(__doc__, seconds=10.0, rounds=4, smoke=smoke, add=_flags)
    every = ["small"] if args.smoke else list(SIZES)
    kinds = every if args.images == "all" else [args.images]
    with tempfile.TemporaryDirectory(prefix="meshfeed-image-store-") as work:
        for kind in kinds:
            count = 512 if args.smoke else 1024 if kind == "imagenet" else 3072
            _case(kind, count, args, Path(work))


if __name__ == "__main__":
    main()
