"""Workload S, data in object storage: a meshfeed folder on an S3-compatible server against
the same folder on local disk.

moto's server on 127.0.0.1: requests and bytes per epoch by shuffle and through
``cache_dir`` (``reads``), samples/s and time to first batch against local files
(``speed``), the demo model's input wait (``input_wait``, goal <= 2%), and the server's
own rate (``server``). ``--smoke`` for CI; the workload is in ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import tempfile
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from harness import arguments, emit, in_rounds, median_of, median_ratio, use_cpu_devices
from workload_fns import images

import meshfeed
from common import DIGITS_BATCH_SIZE, digits, fit_digits
from meshfeed.testing import S3Server

BATCH = 256
SHARD = 4096
BLOCK = {"shuffle_block": 1024, "shuffle_window": 16}
ORDERS: dict[str, dict[str, int]] = {"per-example": {}, "block": BLOCK}


def _line(smoke: bool, **fields: Any) -> None:
    emit("remote", smoke=smoke, workload="S", **fields)


def _loader(source: Any, order: Mapping[str, int], **kwargs: Any) -> meshfeed.Loader:
    mesh = meshfeed.make_mesh(data=jax.device_count())
    return meshfeed.Loader(
        source,
        global_batch_size=kwargs.pop("global_batch_size", BATCH),
        sharding=meshfeed.batch_sharding(mesh),
        **order,
        **kwargs,
    )


def reads(url: str, options: Mapping[str, Any], cache_dir: str, smoke: bool) -> None:
    """Requests and bytes over whole epochs, per shuffle, and through a cache."""
    for name, order in ORDERS.items():
        source = meshfeed.open_source(url, storage_options=options)
        loader = _loader(source, order)
        predicted = loader.plan.fetches
        assert predicted is not None
        before = (source.requests, source.bytes_fetched)
        start = time.perf_counter()
        for batch in loader:
            jax.block_until_ready(batch)
        seconds = time.perf_counter() - start
        requests, fetched = source.requests - before[0], source.bytes_fetched - before[1]
        _line(
            smoke,
            part="reads",
            name=f"s3:{name}",
            shuffle=name,
            **order,
            requests_per_epoch=requests,
            bytes_per_epoch=fetched,
            row_bytes_per_epoch=source.bytes_read,
            bytes_over_rows=round(fetched / max(1, source.bytes_read), 3),
            requests_per_step=round(requests / loader.steps_per_epoch, 2),
            plan_requests_per_step=round(predicted.requests, 2),
            epoch_s=round(seconds, 2),
        )
    source = meshfeed.open_source(url, storage_options=options, cache_dir=cache_dir)
    for epoch in (1, 2):
        loader = _loader(source, BLOCK, seed=epoch)
        before = (source.requests, source.bytes_fetched)
        start = time.perf_counter()
        for batch in loader:
            jax.block_until_ready(batch)
        _line(
            smoke,
            part="reads",
            name=f"s3:block:cache epoch {epoch}",
            shuffle="block",
            **BLOCK,
            cache_epoch=epoch,
            requests_per_epoch=source.requests - before[0],
            bytes_per_epoch=source.bytes_fetched - before[1],
            epoch_s=round(time.perf_counter() - start, 2),
        )


def _timed(path: str, options: Mapping[str, Any] | None, order: Mapping[str, int], steps: int):
    """Seconds to the first batch (open included), then samples/s over ``steps`` more."""
    start = time.perf_counter()
    source = meshfeed.open_source(path, storage_options=options)
    loader = _loader(source, order, num_epochs=None)
    batches = iter(loader)
    jax.block_until_ready(next(batches))
    first = time.perf_counter() - start
    start = time.perf_counter()
    for batch in itertools.islice(batches, steps):
        jax.block_until_ready(batch)
    return {"first_s": first, "samples_per_s": steps * BATCH / (time.perf_counter() - start)}


def speed(url: str, options: Mapping[str, Any], local: str, args: argparse.Namespace) -> None:
    places: dict[str, tuple[str, Mapping[str, Any] | None]] = {
        "local": (local, None),
        "s3": (url, options),
    }
    entries = {
        f"{where}:{name}": lambda at=at, o=order: _timed(at[0], at[1], o, args.steps)
        for name, order in ORDERS.items()
        for where, at in places.items()
    }
    per_round = in_rounds(entries, args.rounds, pause=0.0)
    for entry in entries:
        where, name = entry.split(":")
        _line(
            args.smoke,
            part="speed",
            name=entry,
            where=where,
            shuffle=name,
            samples_per_s=round(median_of(per_round, entry, "samples_per_s") or 0),
            first_batch_s=round(median_of(per_round, entry, "first_s") or 0.0, 3),
            ratio_samples_vs_local=median_ratio(per_round, entry, f"local:{name}", "samples_per_s"),
            ratio_first_batch_vs_local=median_ratio(
                per_round, entry, f"local:{name}", "first_s", digits=2
            ),
            steps=args.steps,
            rounds=args.rounds,
        )


def server_rate(url: str, options: Mapping[str, Any], seconds: float, smoke: bool) -> None:
    """Small range requests per second the server answers, 16 in flight."""
    source = meshfeed.open_source(url, storage_options=options)
    rng = np.random.default_rng(0)
    before, start = source.requests, time.perf_counter()
    while time.perf_counter() - start < seconds:
        # 16 images 96 KiB apart or more: 16 requests (the labels: 1), in flight together
        source[np.sort(rng.choice(len(source) // 32, 16, replace=False)) * 32]
    elapsed = time.perf_counter() - start
    _line(
        smoke,
        part="server",
        name="moto:range requests",
        requests_per_s=round((source.requests - before) / elapsed),
        in_flight=16,
    )


def input_wait(server: S3Server, steps: int, cache_dir: str, smoke: bool) -> None:
    """The demo's convnet trained by ``fit`` on the digits read from the server."""
    url = "s3://data/digits"
    # The default shard size (65,536 rows): the digits are one shard of each field.
    meshfeed.write_source(url, digits(), storage_options=server.storage_options)
    local = os.path.join(cache_dir + "-local", "digits")
    meshfeed.write_source(local, digits())
    variants = {
        "per-example": ({}, None),
        "block": ({"shuffle_block": 64}, None),
        "per-example, cache_dir": ({}, cache_dir),
        "per-example, local files": ({}, None),
    }
    for name, (order, cache) in variants.items():
        source = (
            meshfeed.open_source(local)
            if name.endswith("local files")
            else meshfeed.open_source(url, storage_options=server.storage_options, cache_dir=cache)
        )
        loader = _loader(source, order, global_batch_size=DIGITS_BATCH_SIZE, num_epochs=None)
        history = fit_digits(loader, steps)
        _line(
            smoke,
            part="input_wait",
            name=f"fit:{'local' if name.endswith('local files') else 's3'}:{name}",
            shuffle=name,
            **order,
            input_wait_share=round(history.input_wait_share, 4),
            loader_share=round(history.loader_share, 4),
            samples_per_s=round(history.samples_per_s),
            prefetch_depth=loader.prefetch_depth,
            cache_dir=cache is not None,
            requests=source.requests,
            steps=steps,
            global_batch_size=DIGITS_BATCH_SIZE,
        )


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--examples", type=int, default=32768)
    parser.add_argument("--steps", type=int, default=30, help="speed: steps timed")
    parser.add_argument("--fit-steps", type=int, default=1000)
    parser.add_argument(
        "--parts",
        default="server,reads,speed,input_wait",
        help="comma-separated parts to run (default: all)",
    )


def main() -> None:
    use_cpu_devices()
    smoke = {"examples": SHARD // 2, "steps": 3, "rounds": 1, "fit_steps": 10}
    args = arguments(__doc__, rounds=5, smoke=smoke, add=_flags)
    server = S3Server()
    try:
        server.make_bucket("data")
        data = images(args.examples)
        url = "s3://data/images"
        options = server.storage_options
        with tempfile.TemporaryDirectory() as tmp:
            local = os.path.join(tmp, "images")
            meshfeed.write_source(local, data, shard_size=SHARD)
            meshfeed.write_source(url, data, shard_size=SHARD, storage_options=options)
            parts = args.parts.split(",")
            if "server" in parts:
                server_rate(url, options, 0.5 if args.smoke else 3.0, args.smoke)
            if "reads" in parts:
                reads(url, options, os.path.join(tmp, "cache"), args.smoke)
            if "speed" in parts:
                speed(url, options, local, args)
            if "input_wait" in parts:
                cache_dir = os.path.join(tmp, "digits-cache")
                input_wait(server, args.fit_steps, cache_dir, args.smoke)
    finally:
        server.close()


if __name__ == "__main__":
    main()
