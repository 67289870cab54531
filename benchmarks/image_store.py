"""Workload IS, images on object storage: an image folder against the same images sharded.

The local S3 server (moto, ``meshfeed.testing.S3Server``) behind a ``CountingProxy`` that
holds every request 30 ms (a store's round trip). The same JPEGs are read as

- ``folder``: ``ImageFolderSource("s3://.../train")``, a request per image (64 in flight a
  process), shuffled per example;
- ``shards``: ``open_source`` of what ``shard_images`` wrote from that folder, read with
  ``shuffle_block=64, shuffle_window=4``: each step a few runs of neighbours (which
  ``shard_images`` wrote in a keyed random order, so a run mixes the classes);
- ``folder-2``, ``shards-2``: the same with ``prefetch=2`` instead of the default
  read-ahead (each ratio is taken between entries of the same read-ahead).

Each is read by a process of its own (the proxy's threads stay in the parent), global
batch 256 on 8 CPU devices, the default read-ahead, a record transform that keeps each
image's size and label (no decode: the store's rate, not the cores'), timed for 10 s
after 8 s of reading (a read-ahead 16 deep behind a store that gives ~45 MB/s takes ~6 s
to fill with ImageNet-size steps, and looks slow until then). The shards' requests a
step are their source's count over the timed steps (the folder's: one an image). Two
image sizes: ``imagenet`` (500x375, ~69 KB) and ``small`` (160x120, ~8 KB). Rounds
rotate the order; each line is the median over rounds of images/s, the requests a
step, and the shards' rate over the folder's in the same round (goal >= 10x). Also
``shard_images``' own rate, folder on the store to shards on the store, 2 workers.

Parts are 8 MiB here, not the default 256 MiB: moto reads a whole object to answer a
range of it, so a range of a large object costs it that object's size (a store does not).

Prints one JSON line per measurement; ``--smoke`` for CI.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import json
import platform
import shutil
import statistics
import subprocess
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
from vision import write_folder

BATCH, BLOCK, WINDOW = 256, 64, 4
LATENCY_S = 0.030
PART_BYTES = 8 << 20
SIZES = {"imagenet": (375, 500, 10.0), "small": (120, 160, 10.0)}


def _keep_size(record: dict[str, Any], rng: Any) -> dict[str, Any]:
    return {"size": np.int64(len(record["image"])), "label": record["label"]}


def _rate(which: str, options: dict[str, Any], seconds: float, warmup: float) -> dict[str, float]:
    """One process reading ``which`` (``folder`` or ``shards``) for ``seconds``: its
    images/s and steps (taken in a process of its own, so that the proxy's threads, here,
    do not share its interpreter)."""
    done = subprocess.run(
        [sys.executable, __file__, "--child", which, "--seconds", str(seconds),
         "--warmup", str(warmup), "--options", json.dumps(options)],
        capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"reading {which} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _child(which: str, options: dict[str, Any], seconds: float, warmup: float) -> None:
    if which.startswith("folder"):
        source: Any = meshfeed.ImageFolderSource("s3://data/train", storage_options=options)
        order: dict[str, Any] = {}
    else:
        source = meshfeed.open_source("s3://data/shards", storage_options=options)
        order = {"shuffle_block": BLOCK, "shuffle_window": WINDOW}
    if which.endswith("-2"):
        order["prefetch"] = 2
    sharding = meshfeed.batch_sharding(meshfeed.make_mesh(data=8))
    loader = meshfeed.Loader(
        source, global_batch_size=BATCH, sharding=sharding, num_epochs=None,
        record_transform=_keep_size, **order,
    )  # fmt: skip
    batches = iter(loader)
    start = time.perf_counter()
    next(batches)
    while time.perf_counter() - start < warmup:  # past the read-ahead's fill
        next(batches)
    requests = getattr(source, "requests", None)  # the shards count theirs
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or steps < 2:
        next(batches)
        steps += 1
    elapsed = time.perf_counter() - start
    asked = None if requests is None else (source.requests - requests) / steps
    print(json.dumps({"images_per_s": steps * BATCH / elapsed, "requests_per_step": asked}),
          flush=True)  # fmt: skip
    loader.close()


def _case(
    kind: str, count: int, rounds: int, seconds: float, warmup: float, work: Path,
    part_bytes: int = PART_BYTES,
) -> None:  # fmt: skip
    height, width, noise = SIZES[kind]
    root = write_folder(work / kind / "train", count, height=height, width=width, noise=noise)
    mean_kb = sum(p.stat().st_size for p in root.rglob("*.jpg")) / count / 1e3
    server = S3Server()
    proxy = CountingProxy(server.port)
    try:
        server.make_bucket("data")
        direct = server.storage_options
        held = {**direct, "endpoint_url": proxy.endpoint}
        import s3fs

        s3fs.S3FileSystem(**direct).put(str(root), "s3://data/train", recursive=True)
        for kind_ in ("range", "get", "head", "list"):
            proxy.hold(kind_, 1.0, LATENCY_S)
        start = time.perf_counter()
        status = shard_images("s3://data/train", "s3://data/shards", workers=2,
                                       part_bytes=part_bytes, storage_options=held,
                                       progress=False)  # fmt: skip
        shard_s = time.perf_counter() - start
        print(json.dumps({"workload": "IS", "images": kind, "what": "shard_images",
                          "count": count, "mean_kb": round(mean_kb, 1), "parts": status.parts,
                          "part_bytes": part_bytes,
                          "images_per_s": round(count / shard_s, 1), "workers": 2,
                          "latency_ms": LATENCY_S * 1e3}), flush=True)  # fmt: skip
        names = ["folder", "shards", "folder-2", "shards-2"]
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
        ratios: dict[str, list[float]] = {"shards": [], "shards-2": []}
        for r in range(rounds):
            order = names[r % 4 :] + names[: r % 4]
            got = {}
            for name in order:
                got[name] = _rate(name, held, seconds, warmup)
                runs[name].append(got[name])
            for name in ratios:
                peer = got[name.replace("shards", "folder")]["images_per_s"]
                ratios[name].append(got[name]["images_per_s"] / peer)
        for name, got in runs.items():
            print(json.dumps({
                "workload": "IS", "images": kind, "what": name, "count": count,
                "mean_kb": round(mean_kb, 1), "latency_ms": LATENCY_S * 1e3, "batch": BATCH,
                "images_per_s": round(statistics.median(g["images_per_s"] for g in got), 1),
                "requests_per_step": None if name.startswith("folder") else round(
                    statistics.median(g["requests_per_step"] for g in got), 1),
                "rounds": rounds, "cpus": os.cpu_count(), "python": platform.python_version(),
            }), flush=True)  # fmt: skip
        for name, got_ratios in ratios.items():
            peer = name.replace("shards", "folder")
            print(json.dumps({"workload": "IS", "images": kind, "what": f"{name}/{peer}",
                              "ratio": round(statistics.median(got_ratios), 2),
                              "ratios": [round(x, 2) for x in got_ratios], "goal": 10.0}),
                  flush=True)  # fmt: skip
    finally:
        proxy.close()
        server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="small and short, for CI")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--part-bytes", type=int, default=PART_BYTES, help="shard_images'")
    parser.add_argument("--warmup", type=float, default=8.0, help="seconds read before timing")
    parser.add_argument("--images", choices=[*SIZES, "all"], default="all")
    parser.add_argument(
        "--child", choices=["folder", "shards", "folder-2", "shards-2"], help=argparse.SUPPRESS
    )
    parser.add_argument("--options", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, json.loads(args.options), args.seconds, args.warmup)
        return
    work = Path(tempfile.mkdtemp(prefix="meshfeed-image-store-"))
    try:
        kinds = list(SIZES) if args.images == "all" else [args.images]
        if args.smoke:
            kinds = ["small"] if args.images == "all" else kinds
        for kind in kinds:
            if args.smoke:
                _case(kind, 512, 1, 0.3, 0.0, work)
                continue
            count = 1024 if kind == "imagenet" else 3072
            _case(kind, count, args.rounds, args.seconds, args.warmup, work, args.part_bytes)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
