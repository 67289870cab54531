"""What counting costs: ``loader.stats()``'s counters against the steps they count.

The share is the counter adds a step (``loader.stats()["counter_updates"]``) x the price
of one (``meshfeed.testing.counter_price``) over the step's time, on the cheapest steps
meshfeed makes (in memory, 8 CPU devices, no training): ``plain``, ``record`` (a record
transform) and ``threads`` (2 worker threads and a batch transform). Goal: share <= 1%.
``--against SRC`` also times this build against the meshfeed in ``SRC`` (the commit
before the counters), fresh processes, rotating rounds. ``--smoke`` for CI.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import arguments, emit, in_rounds, median_ratio, run_child, use_cpu_devices

import meshfeed

N = 1 << 16
WIDTH = 32
BATCH = 256
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
    per_step = []
    for _ in range(rounds):
        began = time.perf_counter()
        steps = 0
        while time.perf_counter() - began < window:
            jax.block_until_ready(next(batches))
            steps += 1
        per_step.append((time.perf_counter() - began) / steps)
    total = loader.stats()["counter_updates"] if hasattr(loader, "stats") else 0
    loader.close()
    return statistics.median(per_step), total, loader.step


def _source() -> meshfeed.ArraySource:
    rng = np.random.default_rng(0)
    return meshfeed.ArraySource(
        {"x": rng.random((N, WIDTH), dtype=np.float32), "y": np.arange(N, dtype=np.int64)}
    )


def child(window: float) -> None:
    """Steps/s of the ``plain`` case with ``prefetch=2`` (no depth to settle), the median
    of three windows: what one side of ``--against`` measures, in a process of its own
    (on a build without ``loader.stats``, too)."""
    seconds, _, _ = step_time({"prefetch": 2}, _source(), 3, window)
    print(json.dumps({"steps_per_s": 1.0 / seconds}))


def against(src: str, rounds: int, window: float, smoke: bool) -> None:
    """This build against the meshfeed in ``src`` (a build without the counters: the
    commit before them), each side in a fresh process, the order rotating by round."""
    here = str(Path(meshfeed.__file__).resolve().parents[1])
    command = [__file__, "--child", "--window", str(window)]

    def side(path: str) -> float:
        return run_child(command, env={**os.environ, "PYTHONPATH": path})["steps_per_s"]

    sides = {"here": lambda: side(here), "there": lambda: side(src)}
    per_round = in_rounds(sides, rounds, pause=0)
    by_round = [r["here"] / r["there"] for r in per_round]
    emit(
        "stats",
        smoke=smoke,
        bench="stats",  # the key the committed results/stats.jsonl carries
        case="plain, prefetch=2",
        against=src,
        ratio=median_ratio(per_round, "here", "there", digits=4),
        ratio_by_round=[round(r, 3) for r in by_round],
        rounds=rounds,
        window_s=window,
    )


def _add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--against", metavar="SRC", help="also time against this src/ folder")
    parser.add_argument("--window", type=float, default=0.6, help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)


def main() -> None:
    use_cpu_devices()
    args = arguments(__doc__, rounds=20, smoke={"rounds": 2}, add=_add_flags)
    if args.child:
        return child(args.window)
    rounds = 2 if args.smoke else 7  # of each case's windows; --rounds is --against's
    window = 0.05 if args.smoke else 0.5
    source = _source()
    from meshfeed.testing import counter_price  # here: --child runs on builds without it

    price = counter_price(20_000 if args.smoke else 1_000_000)
    for name, case in CASES.items():
        seconds, updates, steps = step_time(case, source, rounds, window)
        per_step = updates / steps
        share = per_step * price / seconds
        emit(
            "stats",
            smoke=args.smoke,
            bench="stats",
            case=name,
            step_ms=round(1000 * seconds, 4),
            updates_per_step=round(per_step, 2),
            update_us=round(1e6 * price, 3),
            share=round(share, 5),
            goal=GOAL,
            met=share <= GOAL,
            rounds=rounds,
            window_s=window,
            cpus=os.cpu_count(),
        )
    if args.against:
        against(args.against, args.rounds, 0.05 if args.smoke else 0.6, args.smoke)


if __name__ == "__main__":
    main()
