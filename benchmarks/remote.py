"""Workload S, data in object storage: a meshfeed folder on an S3-compatible server against
the same folder on local disk.

The server is moto's (``meshfeed.testing.S3Server``) on 127.0.0.1, started and stopped
here; s3fs is the client. One process, 8 CPU devices. The data: ``--examples`` rows of a
32x32x3 uint8 image and an int32 label (3 KiB a row), shards of 4096 rows, global batch
256. Three parts, one JSON line per measurement:

- ``reads``: range requests and bytes fetched over one whole epoch, with the per-example
  shuffle and with ``shuffle_block=1024`` (window 16), and a second epoch through
  ``cache_dir``; each checked against what ``loader.plan`` predicts for its first steps.
- ``speed``: samples/s over ``--steps`` steps and the time to the first batch
  (``open_source`` + ``Loader`` + first batch), from the server and from local files,
  per shuffle; rounds in rotating order, ratios (server / local) per round, median.
- ``input_wait``: the demo's convnet (workload E) trained by ``fit`` on the digits read
  from the server, default settings, per shuffle and through ``cache_dir``; goal: input
  wait <= 2%.
- ``server``: how many small range requests per second the server answers here (16 in
  flight), the ceiling of every uncached entry: moto is Python and shares the 2 cores.

``--smoke`` for CI.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import itertools
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

import meshfeed
from common import DIGITS_BATCH_SIZE, digits, fit_digits
from meshfeed.testing import S3Server

BATCH = 256
SHARD = 4096
BLOCK = {"shuffle_block": 1024, "shuffle_window": 16}
ORDERS: dict[str, dict[str, int]] = {"per-example": {}, "block": BLOCK}


def _line(**fields: Any) -> None:
    print(
        json.dumps(
            {
                "benchmark": "remote",
                "workload": "S",
                **fields,
                "devices": jax.device_count(),
                "jax": jax.__version__,
                "python": platform.python_version(),
            }
        ),
        flush=True,
    )


def _images(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "image": rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8),
        "label": rng.integers(0, 10, size=n, dtype=np.int32),
    }


def _loader(source: Any, order: Mapping[str, int], **kwargs: Any) -> meshfeed.Loader:
    mesh = meshfeed.make_mesh(data=jax.device_count())
    return meshfeed.Loader(
        source,
        global_batch_size=kwargs.pop("global_batch_size", BATCH),
        sharding=meshfeed.batch_sharding(mesh),
        **order,
        **kwargs,
    )


def reads(url: str, options: Mapping[str, Any], cache_dir: str) -> None:
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
    return first, steps * BATCH / (time.perf_counter() - start)


def speed(url: str, options: Mapping[str, Any], local: str, steps: int, rounds: int) -> None:
    entries = [(where, name) for name in ORDERS for where in ("local", "s3")]
    got: dict[tuple[str, str], list[tuple[float, float]]] = {e: [] for e in entries}
    for r in range(rounds):
        for where, name in entries[r % len(entries) :] + entries[: r % len(entries)]:
            path, opts = (url, options) if where == "s3" else (local, None)
            got[where, name].append(_timed(path, opts, ORDERS[name], steps))
    for (where, name), runs in got.items():
        local_runs = got["local", name]
        _line(
            part="speed",
            name=f"{where}:{name}",
            where=where,
            shuffle=name,
            samples_per_s=round(statistics.median(r[1] for r in runs)),
            first_batch_s=round(statistics.median(r[0] for r in runs), 3),
            ratio_samples_vs_local=round(
                statistics.median(r[1] / lr[1] for r, lr in zip(runs, local_runs, strict=True)), 3
            ),
            ratio_first_batch_vs_local=round(
                statistics.median(r[0] / lr[0] for r, lr in zip(runs, local_runs, strict=True)), 2
            ),
            steps=steps,
            rounds=rounds,
        )


def server_rate(url: str, options: Mapping[str, Any], seconds: float) -> None:
    """Small range requests per second the server answers, 16 in flight."""
    source = meshfeed.open_source(url, storage_options=options)
    rng = np.random.default_rng(0)
    before, start = source.requests, time.perf_counter()
    while time.perf_counter() - start < seconds:
        # 16 images 96 KiB apart or more: 16 requests (the labels: 1), in flight together
        source[np.sort(rng.choice(len(source) // 32, 16, replace=False)) * 32]
    elapsed = time.perf_counter() - start
    _line(
        part="server",
        name="moto:range requests",
        requests_per_s=round((source.requests - before) / elapsed),
        in_flight=16,
    )


def input_wait(server: S3Server, steps: int, cache_dir: str) -> None:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny run for CI")
    parser.add_argument("--examples", type=int, default=32768)
    parser.add_argument("--steps", type=int, default=30, help="speed: steps timed")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--fit-steps", type=int, default=1000)
    parser.add_argument(
        "--parts",
        default="server,reads,speed,input_wait",
        help="comma-separated parts to run (default: all)",
    )
    args = parser.parse_args()
    examples, steps, rounds, fit_steps = (
        (SHARD // 2, 3, 1, 10)
        if args.smoke
        else (args.examples, args.steps, args.rounds, args.fit_steps)
    )
    server = S3Server()
    try:
        server.make_bucket("data")
        data = _images(examples)
        url = "s3://data/images"
        with tempfile.TemporaryDirectory() as tmp:
            local = os.path.join(tmp, "images")
            meshfeed.write_source(local, data, shard_size=SHARD)
            meshfeed.write_source(
                url, data, shard_size=SHARD, storage_options=server.storage_options
            )
            parts = args.parts.split(",")
            if "server" in parts:
                server_rate(url, server.storage_options, 0.5 if args.smoke else 3.0)
            if "reads" in parts:
                reads(url, server.storage_options, os.path.join(tmp, "cache"))
            if "speed" in parts:
                speed(url, server.storage_options, local, steps, rounds)
            if "input_wait" in parts:
                input_wait(server, fit_steps, os.path.join(tmp, "digits-cache"))
    finally:
        server.close()


if __name__ == "__main__":
    main()
