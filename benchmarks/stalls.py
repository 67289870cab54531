"""Workload U, what naming stalls costs: workload H's loader after
``meshfeed.initialize(stall_s=1)`` (progress judged every 0.25 s) against a process without."""

from __future__ import annotations

import numpy as np
from harness import arguments, emit, in_rounds, median_ratio, use_cpu_devices
from remote_fns import in_child, loader, rounded

import meshfeed
from common import measure


def steps_per_s(stalls: bool, seconds: float, smoke: bool) -> float:
    """Steps/s of one fresh process's loader after its warm-up."""
    use_cpu_devices()
    if stalls:
        meshfeed.initialize(stall_s=1.0)  # alone: its own progress judged every 0.25 s
    n = 8_192 if smoke else 50_000
    image = np.random.default_rng(0).integers(0, 256, (n, 32, 32, 3), np.uint8)
    fed = loader(meshfeed.ArraySource({"image": image, "label": np.arange(n)}), 512)
    rate = measure(lambda: iter(fed), 1, seconds, warmup=20 if smoke else 300)
    fed.close()
    return rate


def main() -> None:
    smoke = {"seconds": 0.2, "rounds": 1}
    args = arguments(__doc__, seconds=3.0, rounds=10, smoke=smoke)
    entries = {
        k: lambda on=on: in_child(steps_per_s, on, args.seconds, args.smoke)
        for k, on in (("on", True), ("off", False))
    }
    per_round = in_rounds(entries, args.rounds, pause=0)
    emit(
        "stalls",
        smoke=args.smoke,
        workload="U",
        rounds=args.rounds,
        seconds=args.seconds,
        every_s=0.25,
        on_against_off=median_ratio(per_round, "on", "off"),
        steps_per_s=rounded(per_round, entries, digits=1),
        devices=8,
        processes=1,
    )


if __name__ == "__main__":
    main()
