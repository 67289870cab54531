"""Soak: 100,000 steps (``--smoke``: 2,000) of the demo's loader, 2 record workers: this
process's and its workers' resident memory, threads and open files after the warm-up (10%)
and at the end. Goals: RSS growth <= 5%; no growth in threads or open files.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import time
from typing import Any

import jax
import numpy as np
from harness import arguments, emit, use_cpu_devices

import meshfeed
from common import DIGITS_BATCH_SIZE, digits


def shift(record: dict[str, Any], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Shifts the 8x8 digit by up to one pixel each way (``np.roll``: it wraps around)."""
    dy, dx = rng.integers(-1, 2, 2)
    image = np.roll(record["image"], (int(dy), int(dx)), axis=(0, 1))
    return {"image": image, "label": record["label"]}


def _rss(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def snapshot() -> dict[str, int]:
    workers: set[int] = set()  # this process's children, from /proc
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as f:
            workers.update(int(pid) for pid in f.read().split())
    return {
        "rss_bytes": _rss(),
        "worker_rss_bytes": sum(_rss(pid) for pid in workers),
        "threads": len(os.listdir("/proc/self/task")),
        "open_files": len(os.listdir("/proc/self/fd")),
        "workers": len(workers),
    }


def main() -> None:
    use_cpu_devices()
    args = arguments(
        __doc__,
        smoke={"steps": 2_000},
        add=lambda p: p.add_argument("--steps", type=int, default=100_000),
    )
    loader = meshfeed.Loader(
        meshfeed.ArraySource(digits()),
        global_batch_size=DIGITS_BATCH_SIZE,
        sharding=meshfeed.batch_sharding(meshfeed.make_mesh(data=8)),
        num_epochs=None,
        record_transform=shift,
        num_workers=2,
    )
    warm = max(1, args.steps // 10)
    after_warmup: dict[str, int] = {}
    start = time.perf_counter()
    with contextlib.closing(loader):
        for k, batch in enumerate(itertools.islice(loader, args.steps), start=1):
            jax.block_until_ready(batch)
            del batch
            if k == warm:
                after_warmup = snapshot()
            if k % warm == 0:
                print(f"soak: {k}/{args.steps} steps", file=sys.stderr, flush=True)
        end = snapshot()
        seconds = time.perf_counter() - start
    grown = {k: end[k] - after_warmup[k] for k in end}
    before = after_warmup["rss_bytes"] + after_warmup["worker_rss_bytes"]
    emit(
        "soak",
        smoke=args.smoke,
        steps=args.steps,
        warmup_steps=warm,
        steps_per_s=round(args.steps / seconds),
        rss_growth=round((grown["rss_bytes"] + grown["worker_rss_bytes"]) / before, 4),
        after_warmup=after_warmup,
        end=end,
        thread_growth=grown["threads"],
        open_file_growth=grown["open_files"],
        global_batch_size=DIGITS_BATCH_SIZE,
        num_workers=2,
    )


if __name__ == "__main__":
    main()
