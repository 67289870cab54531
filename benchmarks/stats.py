"""What counting costs: ``loader.stats()``'s counter adds a step x the price of one over the
step's time, on the cheapest steps meshfeed makes. Goal: share <= 1%. ``--against SRC``:
steps/s against the meshfeed in ``SRC`` (the commit before the counters)."""

from __future__ import annotations

import argparse
import functools
import os
import statistics
from pathlib import Path
from typing import Any

import jax
import numpy as np
from harness import arguments, emit, in_rounds, median_ratio, use_cpu_devices
from remote_fns import in_child

import meshfeed
from common import measure

N = 1 << 16
WIDTH = 32
BATCH = 256
GOAL = 0.01


def _double(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    return {"x": record["x"] * 2, "y": record["y"]}


RECORD = {"record_transform": _double}
CASES: dict[str, dict[str, Any]] = {
    "plain": {},
    "record": RECORD,
    "threads": {**RECORD, "num_workers": 2, "worker_type": "threads", "transform": lambda b: b},
}


def step_time(case: dict[str, Any], rounds: int, window: float) -> tuple[float, int, int]:
    """The median over rounds of seconds a step, the counter adds and the steps taken."""
    rng = np.random.default_rng(0)
    arrays = {"x": rng.random((N, WIDTH), dtype=np.float32), "y": np.arange(N, dtype=np.int64)}
    sharding = meshfeed.batch_sharding(meshfeed.make_mesh(data=jax.device_count()))
    options = {"global_batch_size": BATCH, "sharding": sharding, "num_epochs": None}
    loader = meshfeed.Loader(meshfeed.ArraySource(arrays), **options, **case)
    batches = iter(loader)
    for _ in range(20):  # warm: threads started, depth settled
        next(batches)
    per_step = [BATCH / measure(lambda: batches, BATCH, window, 0) for _ in range(rounds)]
    total = loader.stats()["counter_updates"] if hasattr(loader, "stats") else 0
    loader.close()
    return statistics.median(per_step), total, loader.step


def steps_per_s(window: float) -> float:
    """One side of ``--against`` (``plain``, ``prefetch=2``): the median of three windows."""
    return 1.0 / step_time({"prefetch": 2}, 3, window)[0]


def against(src: str, rounds: int, window: float, smoke: bool) -> None:
    """Steps/s (``plain``, ``prefetch=2``) in fresh processes of this build and ``src``'s."""
    sides = {"here": str(Path(meshfeed.__file__).resolve().parents[1]), "there": src}
    runs = {k: functools.partial(in_child, steps_per_s, window, src=p) for k, p in sides.items()}
    per_round = in_rounds(runs, rounds, 0)
    line: dict[str, Any] = {"case": "plain, prefetch=2", "against": src}
    line["ratio"] = median_ratio(per_round, "here", "there", digits=4)
    line["ratio_by_round"] = [round(r["here"] / r["there"], 3) for r in per_round]
    # ``bench``: the key the committed results/stats.jsonl carries
    emit("stats", smoke=smoke, bench="stats", **line, rounds=rounds, window_s=window)


def _add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--against", metavar="SRC", help="also time against this src/ folder")


def main() -> None:
    use_cpu_devices()
    args = arguments(__doc__, rounds=20, smoke={"rounds": 2}, add=_add_flags)
    rounds = 2 if args.smoke else 7  # of each case's windows; --rounds is --against's
    window = 0.05 if args.smoke else 0.5
    from meshfeed.testing import counter_price  # here: --against's other build lacks it

    price = counter_price(20_000 if args.smoke else 1_000_000)
    common = {"goal": GOAL, "rounds": rounds, "window_s": window, "cpus": os.cpu_count()}
    for name, case in CASES.items():
        seconds, updates, steps = step_time(case, rounds, window)
        share = updates / steps * price / seconds
        line = {"step_ms": round(1000 * seconds, 4), "updates_per_step": round(updates / steps, 2)}
        line |= {"update_us": round(1e6 * price, 3), "share": round(share, 5), "met": share <= GOAL}
        emit("stats", smoke=args.smoke, bench="stats", case=name, **line, **common)
    if args.against:
        against(args.against, args.rounds, 0.05 if args.smoke else 0.6, args.smoke)


if __name__ == "__main__":
    main()
