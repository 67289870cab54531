"""Workload S, data in object storage: a meshfeed folder on moto's S3 server against local disk."""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import jax
import numpy as np
from harness import arguments, emit, in_rounds, median_ratio, use_cpu_devices
from remote_fns import FIT_DIGITS, figures, fit_figures, loader, s3_store
from workload_fns import images

import meshfeed
from common import DIGITS_BATCH_SIZE, digits, measure

BATCH = 256
SHARD = 4096
BLOCK = {"shuffle_block": 1024, "shuffle_window": 16}
ORDERS: dict[str, dict[str, int]] = {"per-example": {}, "block": BLOCK}
URL = "s3://data/images"


def _line(args: argparse.Namespace, **fields: Any) -> None:
    emit("remote", smoke=args.smoke, workload="S", **fields)


def _epoch(source: Any, epoch: meshfeed.Loader) -> dict[str, Any]:
    """The requests, bytes fetched and seconds of ``epoch`` (a pass over ``source``)."""
    requests, fetched = source.requests, source.bytes_fetched
    start = time.perf_counter()
    for batch in epoch:
        jax.block_until_ready(batch)
    return {
        "requests_per_epoch": source.requests - requests,
        "bytes_per_epoch": source.bytes_fetched - fetched,
        "epoch_s": round(time.perf_counter() - start, 2),
    }


def reads(options: Mapping[str, Any], tmp: Path, args: argparse.Namespace) -> None:
    """Requests and bytes over whole epochs, per shuffle, and through a cache."""
    for name, order in ORDERS.items():
        source = meshfeed.open_source(URL, storage_options=options)
        epoch = loader(source, BATCH, num_epochs=1, **order)
        planned = epoch.plan.fetches
        assert planned is not None
        got = _epoch(source, epoch)
        _line(
            args,
            part="reads",
            name=f"s3:{name}",
            shuffle=name,
            **order,
            **got,
            row_bytes_per_epoch=source.bytes_read,
            bytes_over_rows=round(got["bytes_per_epoch"] / max(1, source.bytes_read), 3),
            requests_per_step=round(got["requests_per_epoch"] / (epoch.steps_per_epoch or 1), 2),
            plan_requests_per_step=round(planned.requests, 2),
        )
    source = meshfeed.open_source(URL, storage_options=options, cache_dir=tmp / "cache")
    for n in (1, 2):
        got = _epoch(source, loader(source, BATCH, num_epochs=1, seed=n, **BLOCK))
        name = f"s3:block:cache epoch {n}"
        _line(args, part="reads", name=name, shuffle="block", **BLOCK, cache_epoch=n, **got)


def _timed(path: Any, options: Any, order: Mapping[str, int], steps: int) -> dict[str, float]:
    """Seconds to the first batch (open included), then samples/s over ``steps`` more."""
    start = time.perf_counter()
    batches = iter(loader(meshfeed.open_source(path, storage_options=options), BATCH, **order))
    jax.block_until_ready(next(batches))
    first = time.perf_counter() - start
    rate = measure(lambda: batches, BATCH, 0.0, warmup=0, steps=steps)
    return {"first_batch_s": first, "samples_per_s": rate}


def speed(options: Mapping[str, Any], tmp: Path, args: argparse.Namespace) -> None:
    places = {"local": (tmp / "images", None), "s3": (URL, options)}
    entries = {
        f"{where}:{name}": lambda p=path, s=stored, o=order: _timed(p, s, o, args.steps)
        for name, order in ORDERS.items()
        for where, (path, stored) in places.items()
    }
    per_round = in_rounds(entries, args.rounds, pause=0.0)
    for entry in entries:
        where, name = entry.split(":")
        ratio = partial(median_ratio, per_round, entry, f"local:{name}")
        _line(
            args,
            part="speed",
            name=entry,
            where=where,
            shuffle=name,
            **figures(per_round, entry, {"samples_per_s": None, "first_batch_s": 3}),
            ratio_samples_vs_local=ratio("samples_per_s"),
            ratio_first_batch_vs_local=ratio("first_batch_s", digits=2),
            steps=args.steps,
            rounds=args.rounds,
        )


def server_rate(options: Mapping[str, Any], tmp: Path, args: argparse.Namespace) -> None:
    """Small range requests per second the server answers, 16 in flight."""
    source = meshfeed.open_source(URL, storage_options=options)
    rng = np.random.default_rng(0)
    before, start = source.requests, time.perf_counter()
    while time.perf_counter() - start < (0.5 if args.smoke else 3.0):
        # 16 images 96 KiB apart or more: 16 requests (the labels: 1), in flight together
        source[np.sort(rng.choice(len(source) // 32, 16, replace=False)) * 32]
    rate = round((source.requests - before) / (time.perf_counter() - start))
    _line(args, part="server", name="moto:range requests", requests_per_s=rate, in_flight=16)


def input_wait(options: Mapping[str, Any], tmp: Path, args: argparse.Namespace) -> None:
    """The demo's convnet trained by ``fit`` on the digits read from the server."""
    url = "s3://data/digits"
    local = tmp / "digits"
    # The default shard size (65,536 rows): the digits are one shard of each field.
    meshfeed.write_source(url, digits(), storage_options=options)
    meshfeed.write_source(local, digits())
    for name in ("per-example", "block", "per-example, cache_dir", "per-example, local files"):
        order = {"shuffle_block": 64} if name == "block" else {}
        cache = tmp / "digits-cache" if name.endswith("cache_dir") else None
        where = "local" if name.endswith("local files") else "s3"
        stored = {"storage_options": options, "cache_dir": cache} if where == "s3" else {}
        source = meshfeed.open_source(local if where == "local" else url, **stored)
        got = fit_figures(loader(source, DIGITS_BATCH_SIZE, **order), args.fit_steps)
        _line(
            args,
            part="input_wait",
            name=f"fit:{where}:{name}",
            shuffle=name,
            **order,
            **{k: round(v, FIT_DIGITS[k]) for k, v in got.items()},
            cache_dir=cache is not None,
            requests=source.requests,
            steps=args.fit_steps,
            global_batch_size=DIGITS_BATCH_SIZE,
        )


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--examples", type=int, default=32768)
    parser.add_argument("--steps", type=int, default=30, help="speed: steps timed")
    parser.add_argument("--fit-steps", type=int, default=1000)
    parser.add_argument("--parts", default="server,reads,speed,input_wait", help="in this order")


def main() -> None:
    use_cpu_devices()
    smoke = {"examples": SHARD // 2, "steps": 3, "rounds": 1, "fit_steps": 10}
    args = arguments(__doc__, rounds=5, smoke=smoke, add=_flags)
    with s3_store() as (server, _, _), tempfile.TemporaryDirectory() as tmp:
        options = server.storage_options
        data = images(args.examples)
        meshfeed.write_source(Path(tmp) / "images", data, shard_size=SHARD)
        meshfeed.write_source(URL, data, shard_size=SHARD, storage_options=options)
        parts = {"server": server_rate, "reads": reads, "speed": speed, "input_wait": input_wait}
        for part in args.parts.split(","):
            parts[part](options, Path(tmp), args)


if __name__ == "__main__":
    main()
