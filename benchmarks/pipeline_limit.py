"""The record pipeline against the machine's limit, and the loader's own cost.

Workload C (``decode_throughput.py``): PNG-encoded 32x32 RGB images decoded and randomly
cropped per record, global batch 256, into global ``jax.Array`` batches on 8 CPU
devices in one process. Entries, each timed in every round, in an order that rotates:

- ``limit``: two processes running the plain decode loop at once, nothing else: what
  the two cores really give;
- ``loop``: one plain loop;
- ``record-loop:2``: two processes running meshfeed's own record loop at once
  (``transform_rows``, what a worker runs on a chunk: each example's generator, the
  checks, the output stored in a batch of 128 rows), nothing else: no loading process,
  no shared memory, no messages. The most any pipeline built on that loop can give
  here;
- ``torch:2``: the PyTorch ``DataLoader`` with 2 workers (numpy collate), then
  ``make_array_from_process_local_data``;
- ``meshfeed:2`` and ``meshfeed-threads:2``: ``Loader(record_transform=decode_crop,
  num_workers=2)`` with worker processes, and with threads;
- ``identity:2``: the same loader, worker processes, with a record transform that
  returns its record (a 28x28x3 uint8 image and a label): only the pipeline's own cost.

For the meshfeed entries the lines also give the CPU the loading process spends per
batch (every thread of it: reading the source, handing rows to the workers, placing
batches; ``time.process_time``) and the workers' CPU per record (``psutil``), so the
pipeline's own cost is a figure, not a guess. Medians over rounds; ratios are medians
of per-round ratios. Prints one JSON line per entry; ``--smoke`` for CI.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_fns import CROP, encode_all, identity
from decode_throughput import BATCH, _loop, _loops_at_once, _meshfeed, _torch

_RECORD_LOOP = """
import sys, time
sys.path.insert(0, {here!r})
import numpy as np
from decode_fns import CROP, decode_crop, encode_all
from meshfeed.workers._record_rows import transform_rows
encoded, labels = encode_all({n})
ids = np.arange(len(labels))
out = {{"image": np.zeros((128, CROP, CROP, 3), np.uint8), "label": np.zeros(128, np.int32)}}
current = np.zeros(1, np.int64)
print("ready", flush=True)
sys.stdin.readline()
done, start = 0, time.perf_counter()
while time.perf_counter() - start < {seconds}:
    for lo in range(0, len(labels), 128):
        rows = slice(lo, lo + 128)
        part = {{"png": encoded[rows], "label": labels[rows]}}
        transform_rows(decode_crop, part, ids[rows], out, 0, 0, 0, current)
    done += len(labels)
print(done / (time.perf_counter() - start), flush=True)
"""


def _children_cpu() -> float:
    """CPU seconds of this process's live children (the record workers)."""
    try:
        import psutil
    except ImportError:
        return float("nan")
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def _timed(run: Callable[[], Iterator[Any]], seconds: float, warmup: int = 5) -> dict[str, float]:
    """Records/s of ``run()`` over ``seconds`` of steady state, and the CPU the loading
    process and its children spent per batch and per record meanwhile."""
    it = run()
    for _ in range(warmup):
        jax.block_until_ready(next(it))
    batches = 0
    cpu, children, start = time.process_time(), _children_cpu(), time.perf_counter()
    while True:
        jax.block_until_ready(next(it))
        batches += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            break
    out = {
        "rate": batches * BATCH / elapsed,
        "loader_cpu_ms_per_batch": 1000 * (time.process_time() - cpu) / batches,
        "worker_cpu_us_per_record": 1e6 * (_children_cpu() - children) / (batches * BATCH),
    }
    del it
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny data and timings, for CI")
    parser.add_argument("--seconds", type=float, default=2.0, help="per entry per round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds; the median")
    parser.add_argument("--examples", type=int, default=30_000)
    parser.add_argument("--label", default="", help="a tag for this run (e.g. before/after)")
    args = parser.parse_args()
    seconds, rounds, n = (
        (0.3, 1, 2048) if args.smoke else (args.seconds, args.rounds, args.examples)
    )
    encoded, labels = encode_all(n)
    pngs = {"png": encoded, "label": labels}
    rng = np.random.default_rng(0)
    images = {"image": rng.integers(0, 255, (n, CROP, CROP, 3), np.uint8), "label": labels}

    def loader(run: Callable[[], Iterator[Any]] | str) -> Callable[[], dict[str, float]] | str:
        """A loader's entry, timed by ``_timed``; a reason it is skipped stays as it is."""
        return run if isinstance(run, str) else lambda: _timed(run, seconds)

    entries: dict[str, Callable[[], dict[str, float]] | str] = {
        "limit": lambda: {"rate": _loops_at_once(2, seconds)},
        "loop": lambda: {"rate": _loop(encoded, labels, seconds)},
        "record-loop:2": lambda: {"rate": _loops_at_once(2, seconds, loop=_RECORD_LOOP)},
        "torch:2": loader(_torch(encoded, labels, 2)),
        "meshfeed:2": loader(_meshfeed(pngs, 2)),
        "meshfeed-threads:2": loader(_meshfeed(pngs, 2, "threads")),
        "identity:2": loader(_meshfeed(images, 2, fn=identity)),
    }
    timed = {k: v for k, v in entries.items() if not isinstance(v, str)}
    names = list(timed)
    per_round: list[dict[str, dict[str, float]]] = []
    for r in range(rounds):
        got: dict[str, dict[str, float]] = {}
        for name in names[r % len(names) :] + names[: r % len(names)]:
            got[name] = timed[name]()
            gc.collect()
            time.sleep(0.3)  # let the entry's workers go before the next one starts
        per_round.append(got)

    def median(fn: Callable[[dict[str, dict[str, float]]], float]) -> float:
        return round(statistics.median(fn(r) for r in per_round), 3)

    for name, run in entries.items():
        line: dict[str, Any] = {
            "benchmark": "pipeline_limit",
            "workload": "C",
            "name": name,
            "label": args.label,
            "global_batch_size": BATCH,
            "examples": n,
            "rounds": rounds,
            "window_s": seconds,
            "devices": jax.device_count(),
            "smoke": args.smoke,
            "jax": jax.__version__,
            "python": platform.python_version(),
        }
        if name not in names:
            line["skipped"] = run
            print(json.dumps(line), flush=True)
            continue
        line["records_per_s"] = round(median(lambda r, name=name: r[name]["rate"]))
        if name != "identity:2":
            line["ratio_to_limit"] = median(
                lambda r, name=name: r[name]["rate"] / r["limit"]["rate"]
            )
        if name.startswith("meshfeed"):
            line["ratio_to_record_loop"] = median(
                lambda r, name=name: r[name]["rate"] / r["record-loop:2"]["rate"]
            )
        if name.startswith("meshfeed") and "torch:2" in names:
            line["ratio_to_torch"] = median(
                lambda r, name=name: r[name]["rate"] / r["torch:2"]["rate"]
            )
        for key in ("loader_cpu_ms_per_batch", "worker_cpu_us_per_record"):
            if key in per_round[0][name]:
                line[key] = median(lambda r, name=name, key=key: r[name][key])
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
