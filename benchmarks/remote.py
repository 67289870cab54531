"""Workload S, data in object storage: a meshfeed folder on moto's S3 server against the
same folder on local disk (parts ``server``, ``reads``, ``speed``, ``input_wait``)."""

from __future__ import annotations

import argparse
import itertools
import os
import tempfile
import time
from collections.abc import Mapping
from functools import partial
from typing import Any

import jax
import numpy as np
from harness import arguments, emit, in_rounds, median_ratio, use_cpu_devices
from remote_fns import figures, loader, s3_store
from workload_fns import images

import meshfeed
from common import DIGITS_BATCH_SIZE, digits, fit_digits

BATCH = 256
SHARD = 4096
BLOCK = {"shuffle_block": 1024, "shuffle_window": 16}
ORDERS: dict[str, dict[str, int]] = {"per-example": {}, "block": BLOCK}


def _line(smoke: bool, **fields: Any) -> None:
    emit("remote", smoke=smoke, workload="S", **fields)


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


def reads(url: str, options: Mapping[str, Any], cache_dir: str, smoke: bool) -> None:
    """Requests and bytes over whole epochs, per shuffle, and through a cache."""
    for name, order in ORDERS.items():
        source = meshfeed.open_source(url, storage_options=options)
        epoch = loader(source, BATCH, num_epochs=1, **order)
        planned = epoch.plan.fetches
        assert planned is not None
        got = _epoch(source, epoch)
        _line(
            smoke,
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
    source = meshfeed.open_source(url, storage_options=options, cache_dir=cache_dir)
    for n in (1, 2):
        got = _epoch(source, loader(source, BATCH, num_epochs=1, seed=n, **BLOCK))
        name = f"s3:block:cache epoch {n}"
        _line(smoke, part="reads", name=name, shuffle="block", **BLOCK, cache_epoch=n, **got)


def _timed(path: str, options: Any, order: Mapping[str, int], steps: int) -> dict[str, float]:
    """Seconds to the first batch (open included), then samples/s over ``steps`` more."""
    start = time.perf_counter()
    batches = iter(loader(meshfeed.open_source(path, storage_options=options), BATCH, **order))
    jax.block_until_ready(next(batches))
    first = time.perf_counter() - start
    start = time.perf_counter()
    for batch in itertools.islice(batches, steps):
        jax.block_until_ready(batch)
    return {"first_batch_s": first, "samples_per_s": steps * BATCH / (time.perf_counter() - start)}


def speed(url: str, options: Mapping[str, Any], local: str, args: argparse.Namespace) -> None:
    places = {"local": (local, None), "s3": (url, options)}
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
            args.smoke,
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


def server_rate(url: str, options: Mapping[str, Any], seconds: float, smoke: bool) -> None:
    """Small range requests per second the server answers, 16 in flight."""
    source = meshfeed.open_source(url, storage_options=options)
    rng = np.random.default_rng(0)
    before, start = source.requests, time.perf_counter()
    while time.perf_counter() - start < seconds:
        # 16 images 96 KiB apart or more: 16 requests (the labels: 1), in flight together
        source[np.sort(rng.choice(len(source) // 32, 16, replace=False)) * 32]
    rate = round((source.requests - before) / (time.perf_counter() - start))
    _line(smoke, part="server", name="moto:range requests", requests_per_s=rate, in_flight=16)


def input_wait(options: Mapping[str, Any], steps: int, cache_dir: str, smoke: bool) -> None:
    """The demo's convnet trained by ``fit`` on the digits read from the server."""
    url, local = "s3://data/digits", os.path.join(cache_dir + "-local", "digits")
    # The default shard size (65,536 rows): the digits are one shard of each field.
    meshfeed.write_source(url, digits(), storage_options=options)
    meshfeed.write_source(local, digits())
    for name in ("per-example", "block", "per-example, cache_dir", "per-example, local files"):
        order = {"shuffle_block": 64} if name == "block" else {}
        cache = cache_dir if name.endswith("cache_dir") else None
        where = "local" if name.endswith("local files") else "s3"
        stored = {"storage_options": options, "cache_dir": cache} if where == "s3" else {}
        source = meshfeed.open_source(local if where == "local" else url, **stored)
        fed = loader(source, DIGITS_BATCH_SIZE, **order)
        history = fit_digits(fed, steps)
        _line(
            smoke,
            part="input_wait",
            name=f"fit:{where}:{name}",
            shuffle=name,
            **order,
            input_wait_share=round(history.input_wait_share, 4),
            loader_share=round(history.loader_share, 4),
            samples_per_s=round(history.samples_per_s),
            prefetch_depth=fed.prefetch_depth,
            cache_dir=cache is not None,
            requests=source.requests,
            steps=steps,
            global_batch_size=DIGITS_BATCH_SIZE,
        )


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--examples", type=int, default=32768)
    parser.add_argument("--steps", type=int, default=30, help="speed: steps timed")
    parser.add_argument("--fit-steps", type=int, default=1000)
    parser.add_argument("--parts", default="server,reads,speed,input_wait", help="to run")


def main() -> None:
    use_cpu_devices()
    smoke = {"examples": SHARD // 2, "steps": 3, "rounds": 1, "fit_steps": 10}
    args = arguments(__doc__, rounds=5, smoke=smoke, add=_flags)
    parts = args.parts.split(",")
    url = "s3://data/images"
    with s3_store() as (server, _, _), tempfile.TemporaryDirectory() as tmp:
        options = server.storage_options
        data = images(args.examples)
        local = os.path.join(tmp, "images")
        meshfeed.write_source(local, data, shard_size=SHARD)
        meshfeed.write_source(url, data, shard_size=SHARD, storage_options=options)
        if "server" in parts:
            server_rate(url, options, 0.5 if args.smoke else 3.0, args.smoke)
        if "reads" in parts:
            reads(url, options, os.path.join(tmp, "cache"), args.smoke)
        if "speed" in parts:
            speed(url, options, local, args)
        if "input_wait" in parts:
            input_wait(options, args.fit_steps, os.path.join(tmp, "digits-cache"), args.smoke)


if __name__ == "__main__":
    main()
