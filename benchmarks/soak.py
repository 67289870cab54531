"""Soak: 100,000 steps (``--smoke``: 2,000) of the demo's loader, 2 record workers: this
process's and its workers' resident memory, threads and open files after the warm-up (10%)
and at the end. Goals: RSS growth <= 5%; no growth in threads or open files.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import time
from typing import Any

import jax
import numpy as np
import psutil
from harness import arguments, emit, use_cpu_devices

import meshfeed
from common import DIGITS_BATCH_SIZE, digits


def shift(record: dict[str, Any], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Shifts the 8x8 digit by up to one pixel each way (``np.roll``: it wraps around)."""
    dy, dx = rng.integers(-1, 2, 2)
    image = np.roll(record["image"], (int(dy), int(dx)), axis=(0, 1))
    return {"image": image, "label": record["label"]}


def snapshot() -> dict[str, int]:
    me = psutil.Process()
    workers = me.children()
    return {
        "rss_bytes": me.memory_info().rss,
        "worker_rss_bytes": sum(w.memory_info().rss for w in workers),
        "threads": me.num_threads(),
        "open_files": me.num_fds(),
        "workers": len(workers),
    }


def main() -> None:
    use_cpu_devices()
    args = arguments(__doc__)
    steps = 2_000 if args.smoke else 100_000
    loader = meshfeed.Loader(
        meshfeed.ArraySource(digits()),
        global_batch_size=DIGITS_BATCH_SIZE,
        sharding=meshfeed.batch_sharding(meshfeed.make_mesh(data=8)),
        num_epochs=None,
        record_transform=shift,
        num_workers=2,
    )
    warm = steps // 10
    after_warmup: dict[str, int] = {}
    start = time.perf_counter()
    with contextlib.closing(loader):
        for k, batch in enumerate(itertools.islice(loader, steps), start=1):
            jax.block_until_ready(batch)
            del batch
            if k == warm:
                after_warmup = snapshot()
            if k % warm == 0:
                print(f"soak: {k}/{steps} steps", file=sys.stderr, flush=True)
        end = snapshot()
        seconds = time.perf_counter() - start
    grown = {k: end[k] - after_warmup[k] for k in end}
    before = after_warmup["rss_bytes"] + after_warmup["worker_rss_bytes"]
    emit(
        "soak",
        smoke=args.smoke,
        steps=steps,
        warmup_steps=warm,
        steps_per_s=round(steps / seconds),
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
