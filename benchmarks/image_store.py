"""Workload IS, images on object storage: an image folder against the same images sharded.

moto's S3 server behind a ``CountingProxy`` that holds every request 30 ms. The same
JPEGs read as ``folder`` (``ImageFolderSource``, a request an image) and ``shards``
(``open_source`` of what ``shard_images`` wrote, ``shuffle_block=64, shuffle_window=4``),
each with the default read-ahead and with ``prefetch=2`` (``folder-2``, ``shards-2``),
each in a process of its own: images/s over 10 s after 8 s, batch 256 on 8 CPU devices,
rotating rounds, the shards over the folder in each round (goal >= 10x); also
``shard_images``' own rate. Parts are 8 MiB: moto reads a whole object to answer a
range of it. README.md says more. ``--smoke`` for CI.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import meshfeed
from meshfeed.testing import CountingProxy, S3Server
from meshfeed.vision import shard_images

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import arguments, emit, in_rounds, median_of, run_child, use_cpu_devices
from vision import write_folder

BATCH = 256
BLOCK = 64
WINDOW = 4
LATENCY_S = 0.030
PART_BYTES = 8 << 20
SIZES = {"imagenet": (375, 500, 10.0), "small": (120, 160, 10.0)}
READERS = ["folder", "shards", "folder-2", "shards-2"]


def _keep_size(record: dict[str, Any], rng: Any) -> dict[str, Any]:
    return {"size": np.int64(len(record["image"])), "label": record["label"]}


def _child(which: str, options: dict[str, Any], seconds: float, warmup: float) -> None:
    """Reads ``which`` for ``seconds`` after ``warmup``: its images/s and requests a step
    (in a process of its own, so that the proxy's threads do not share its interpreter)."""
    use_cpu_devices()
    if which.startswith("folder"):
        source: Any = meshfeed.ImageFolderSource("s3://data/train", storage_options=options)
        order: dict[str, Any] = {}
    else:
        source = meshfeed.open_source("s3://data/shards", storage_options=options)
        order = {"shuffle_block": BLOCK, "shuffle_window": WINDOW}
    if which.endswith("-2"):
        order["prefetch"] = 2
    loader = meshfeed.Loader(
        source,
        global_batch_size=BATCH,
        sharding=meshfeed.batch_sharding(meshfeed.make_mesh(data=8)),
        num_epochs=None,
        record_transform=_keep_size,
        **order,
    )
    batches = iter(loader)
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
    print(json.dumps({"images_per_s": steps * BATCH / elapsed, "requests_per_step": asked}))
    loader.close()


def _shard(count: int, held: dict[str, Any], part_bytes: int) -> dict[str, Any]:
    """``shard_images``' own rate, folder on the store to shards on the store."""
    start = time.perf_counter()
    status = shard_images(
        "s3://data/train",
        "s3://data/shards",
        workers=2,
        part_bytes=part_bytes,
        storage_options=held,
        progress=False,
    )
    rate = count / (time.perf_counter() - start)
    return {"parts": status.parts, "part_bytes": part_bytes, "images_per_s": round(rate, 1)}


def _case(kind: str, count: int, args: argparse.Namespace, work: Path) -> None:
    height, width, noise = SIZES[kind]
    root = write_folder(work / kind / "train", count, height=height, width=width, noise=noise)
    mean_kb = round(sum(p.stat().st_size for p in root.rglob("*.jpg")) / count / 1e3, 1)
    server = S3Server()
    proxy = CountingProxy(server.port)
    try:
        server.make_bucket("data")
        held = {**server.storage_options, "endpoint_url": proxy.endpoint}
        import s3fs

        s3fs.S3FileSystem(**server.storage_options).put(
            str(root), "s3://data/train", recursive=True
        )
        for request in ("range", "get", "head", "list"):
            proxy.hold(request, 1.0, LATENCY_S)
        # devices: the readers'; this process never starts JAX
        common = {"smoke": args.smoke, "devices": 8, "processes": 1}
        common.update(workload="IS", images=kind)
        shard = _shard(count, held, args.part_bytes)
        sizes = {"count": count, "mean_kb": mean_kb}
        emit(
            "image_store",
            **common,
            what="shard_images",
            **sizes,
            **shard,
            workers=2,
            latency_ms=LATENCY_S * 1e3,
        )

        def reader(name: str) -> Any:
            options = ["--options", json.dumps(held), "--warmup", str(args.warmup)]
            command = [__file__, "--child", name, "--seconds", str(args.seconds), *options]
            return lambda: run_child(command)

        per_round = in_rounds({name: reader(name) for name in READERS}, args.rounds, pause=0)
    finally:
        proxy.close()
        server.close()
    for name in READERS:
        asked = median_of(per_round, name, "requests_per_step")
        emit(
            "image_store",
            **common,
            what=name,
            **sizes,
            latency_ms=LATENCY_S * 1e3,
            batch=BATCH,
            images_per_s=round(median_of(per_round, name, "images_per_s") or 0.0, 1),
            requests_per_step=None if name.startswith("folder") else round(asked or 0.0, 1),
            rounds=args.rounds,
            cpus=os.cpu_count(),
        )
    for name in ("shards", "shards-2"):
        peer = name.replace("shards", "folder")
        ratios = [r[name]["images_per_s"] / r[peer]["images_per_s"] for r in per_round]
        emit(
            "image_store",
            **common,
            what=f"{name}/{peer}",
            ratio=round(statistics.median(ratios), 2),
            ratios=[round(x, 2) for x in ratios],
            goal=10.0,
        )


def _add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--part-bytes", type=int, default=PART_BYTES, help="shard_images'")
    parser.add_argument("--warmup", type=float, default=8.0, help="seconds read before timing")
    parser.add_argument("--images", choices=[*SIZES, "all"], default="all")
    parser.add_argument("--child", choices=READERS, help=argparse.SUPPRESS)
    parser.add_argument("--options", help=argparse.SUPPRESS)


def main() -> None:
    smoke = {"rounds": 1, "seconds": 0.3, "warmup": 0.0, "part_bytes": PART_BYTES}
    args = arguments(__doc__, seconds=10.0, rounds=4, smoke=smoke, add=_add_flags)
    if args.child:
        _child(args.child, json.loads(args.options), args.seconds, args.warmup)
        return
    work = Path(tempfile.mkdtemp(prefix="meshfeed-image-store-"))
    try:
        kinds = list(SIZES) if args.images == "all" else [args.images]
        if args.smoke and args.images == "all":
            kinds = ["small"]
        for kind in kinds:
            count = 512 if args.smoke else 1024 if kind == "imagenet" else 3072
            _case(kind, count, args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
