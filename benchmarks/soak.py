"""Soak: 100,000 steps of the demo's loader with prefetch and record workers.

One process, 8 CPU devices, scikit-learn's digits (global batch 64, shuffled, endless),
a per-record random shift in 2 worker processes, the default ``prefetch``. Every batch
is waited for on the devices and dropped. After a warm-up (the first 10% of steps) and at
the end it records the resident memory of this process and of its workers
(``/proc/<pid>/status``), the threads of this process and its open files
(``/proc/self/fd``).

Goals: RSS growth <= 5% after warm-up; no growth in threads or open files. Prints one
JSON line (and a progress line to stderr every 10%); ``--smoke`` runs 2,000 steps.
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
import sys
import time
from pathlib import Path
from typing import Any

import jax

sys.path.insert(0, str(Path(__file__).resolve().parent))
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="2,000 steps, for CI")
    parser.add_argument("--steps", type=int, default=100_000)
    args = parser.parse_args()
    steps = 2_000 if args.smoke else args.steps
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
    line: dict[str, Any] = {
        "benchmark": "soak",
        "steps": steps,
        "warmup_steps": warm,
        "steps_per_s": round(steps / seconds),
        "rss_growth": round(growth, 4),
        "after_warmup": after_warmup,
        "end": end,
        "thread_growth": end["threads"] - after_warmup["threads"],
        "open_file_growth": end["open_files"] - after_warmup["open_files"],
        "global_batch_size": GLOBAL_BATCH_SIZE,
        "num_workers": 2,
        "devices": jax.device_count(),
        "smoke": args.smoke,
        "jax": jax.__version__,
        "python": platform.python_version(),
    }
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
