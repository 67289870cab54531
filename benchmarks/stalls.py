"""Workload U, what naming stalls costs: a process's progress, made and judged every few seconds.

In fresh processes of one process each, 8 CPU devices: workload H's loader (50,000 rows
of 32x32x3 uint8 in memory, batch 512) after ``meshfeed.initialize(stall_s=1)``
(progress every 0.25 s, 20 times the default rate) against one in a process that never
called it: steps/s over ``--seconds`` after 300 steps of warm-up, rotating rounds, the
median of per-round ratios (goal >= 0.99). ``--smoke`` for CI.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import arguments, emit, in_rounds, median_of, median_ratio, run_child, use_cpu_devices


def _child(stalls: bool, seconds: float, smoke: bool) -> float:
    use_cpu_devices()
    import jax
    import numpy as np

    import meshfeed

    if stalls:
        meshfeed.initialize(stall_s=1.0)  # alone: its own progress judged every 0.25 s
    rng = np.random.default_rng(0)
    n = 8_192 if smoke else 50_000
    source = meshfeed.ArraySource(
        {"image": rng.integers(0, 256, (n, 32, 32, 3), np.uint8), "label": np.arange(n)}
    )
    loader = meshfeed.Loader(
        source,
        global_batch_size=512,
        num_epochs=None,
        sharding=meshfeed.batch_sharding(meshfeed.make_mesh(data=8)),
    )
    it = iter(loader)
    for _ in range(20 if smoke else 300):
        jax.block_until_ready(next(it))
    done = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        jax.block_until_ready(next(it))
        done += 1
    rate = done / (time.perf_counter() - start)
    loader.close()
    return rate


def _add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--child", choices=["on", "off"], help=argparse.SUPPRESS)


def main() -> None:
    args = arguments(
        __doc__, seconds=3.0, rounds=10, smoke={"seconds": 0.2, "rounds": 1}, add=_add_flags
    )
    if args.child:
        print(json.dumps({"steps_per_s": _child(args.child == "on", args.seconds, args.smoke)}))
        return

    def child(name: str) -> float:
        command = [__file__, "--child", name, "--seconds", str(args.seconds)]
        return run_child(command + (["--smoke"] if args.smoke else []))["steps_per_s"]

    per_round = in_rounds(
        {"on": lambda: child("on"), "off": lambda: child("off")}, args.rounds, pause=0
    )
    emit(
        "stalls",
        smoke=args.smoke,
        workload="U",
        rounds=args.rounds,
        seconds=args.seconds,
        every_s=0.25,
        on_against_off=median_ratio(per_round, "on", "off"),
        steps_per_s={k: round(median_of(per_round, k) or 0.0, 1) for k in ("on", "off")},
        devices=8,
        processes=1,
    )


if __name__ == "__main__":
    main()
