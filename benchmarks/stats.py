"""What counting costs: ``loader.stats()``'s counters against the steps they count.

The counters are always on, so their cost is estimated from their count and their price
rather than against a build without them: each stage adds to its counters once per call
(a step, a chunk), never per record. ``loader.stats()["counter_updates"]`` says how many
adds a run made; one add, as wide as the widest a stage makes (the consumer's, ten
amounts), with the two clock reads that time a stage around it, is timed alone
(``meshfeed.testing.counter_price``: meshfeed's own counter, a million adds, best of
five). The share is ``updates a step x price of one / the step's time``, on the
cheapest steps meshfeed makes
(an in-memory source, 8 CPU devices, no training: whatever a step does besides, the
share only falls): ``plain`` (no transform), ``record`` (a record transform in the
loading threads) and ``threads`` (a record transform on 2 worker threads, and a batch
transform). Each case's step time is the median of rounds of at least 0.3 s. Goal:
share <= 1%. Prints one JSON line per case; ``--smoke`` for CI.
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
import statistics
import time
from typing import Any

import jax
import numpy as np

import meshfeed
from meshfeed.testing import counter_price

N, WIDTH, BATCH = 1 << 16, 32, 256
GOAL = 0.01


def _double(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    return {"x": record["x"] * 2, "y": record["y"]}


CASES: dict[str, dict[str, Any]] = {
    "plain": {},
    "record": {"record_transform": _double},
    "threads": {
        "record_transform": _double,
        "num_workers": 2,
        "worker_type": "threads",
        "transform": lambda batch: batch,
    },
}


def step_time(case: dict[str, Any], source: meshfeed.ArraySource, rounds: int, window: float):
    """The median over rounds of seconds a step, and the counter adds a step."""
    mesh = meshfeed.make_mesh(data=jax.device_count())
    loader = meshfeed.Loader(
        source,
        global_batch_size=BATCH,
        sharding=meshfeed.batch_sharding(mesh),
        num_epochs=None,
        **case,
    )
    batches = iter(loader)
    for _ in range(20):  # warm: threads started, depth settled
        next(batches)
    per_step, updates = [], []
    for _ in range(rounds):
        loader.stats(reset=True)
        began, steps = time.perf_counter(), 0
        while time.perf_counter() - began < window:
            jax.block_until_ready(next(batches))
            steps += 1
        stats = loader.stats(reset=True)
        per_step.append((time.perf_counter() - began) / steps)
        updates.append(stats["counter_updates"])
    total = loader.stats()["counter_updates"]
    loader.close()
    return statistics.median(per_step), total, loader.step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny run for CI")
    args = parser.parse_args()
    rounds, window, times = (2, 0.05, 20_000) if args.smoke else (7, 0.5, 1_000_000)
    rng = np.random.default_rng(0)
    source = meshfeed.ArraySource(
        {"x": rng.random((N, WIDTH), dtype=np.float32), "y": np.arange(N, dtype=np.int64)}
    )
    price = counter_price(times)
    for name, case in CASES.items():
        seconds, updates, steps = step_time(case, source, rounds, window)
        per_step = updates / steps
        share = per_step * price / seconds
        line = {
            "bench": "stats",
            "case": name,
            "step_ms": round(1000 * seconds, 4),
            "updates_per_step": round(per_step, 2),
            "update_us": round(1e6 * price, 3),
            "share": round(share, 5),
            "goal": GOAL,
            "met": share <= GOAL,
            "rounds": rounds,
            "window_s": window,
            "devices": jax.device_count(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "jax": jax.__version__,
            "smoke": args.smoke,
        }
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
