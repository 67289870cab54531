"""Soak: 100,000 steps of the demo's loader with prefetch and record workers.

One process, 8 CPU devices, the digits (batch 64, shuffled, endless), a per-record
random shift in 2 worker processes, the default ``prefetch``; every batch waited for and
dropped. After the warm-up (10% of steps) and at the end: the resident memory of this
process and its workers, its threads and open files. Goals: RSS growth <= 5% after
warm-up; no growth in threads or open files. ``--smoke`` (2,000 steps) for CI.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import arguments, emit, use_cpu_devices
from soak_fns import shift

import meshfeed
from common import DIGITS_BATCH_SIZE as GLOBAL_BATCH_SIZE
from common import digits


def _rss(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _children() -> list[int]:
    """This process's child processes (the record workers), from ``/proc``."""
    pids: set[int] = set()
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as f:
            pids.update(int(pid) for pid in f.read().split())
    return sorted(pids)


def snapshot() -> dict[str, int]:
    workers = _children()
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
    steps = args.steps
    train = digits()
    loader = meshfeed.Loader(
        meshfeed.ArraySource(train),
        global_batch_size=GLOBAL_BATCH_SIZE,
        sharding=meshfeed.batch_sharding(meshfeed.make_mesh(data=8)),
        num_epochs=None,
        record_transform=shift,
        num_workers=2,
    )
    warm = max(1, steps // 10)
    start = time.perf_counter()
    after_warmup: dict[str, int] = {}
    try:
        for k, batch in enumerate(loader, start=1):
            jax.block_until_ready(batch)
            del batch
            if k == warm:
                after_warmup = snapshot()
            if k % warm == 0:
                print(f"soak: {k}/{steps} steps", file=sys.stderr, flush=True)
            if k == steps:
                break
        end = snapshot()
        seconds = time.perf_counter() - start
    finally:
        loader.close()
    growth = (end["rss_bytes"] + end["worker_rss_bytes"]) / (
        after_warmup["rss_bytes"] + after_warmup["worker_rss_bytes"]
    ) - 1
    emit(
        "soak",
        smoke=args.smoke,
        steps=steps,
        warmup_steps=warm,
        steps_per_s=round(steps / seconds),
        rss_growth=round(growth, 4),
        after_warmup=after_warmup,
        end=end,
        thread_growth=end["threads"] - after_warmup["threads"],
        open_file_growth=end["open_files"] - after_warmup["open_files"],
        global_batch_size=GLOBAL_BATCH_SIZE,
        num_workers=2,
    )


if __name__ == "__main__":
    main()
