"""Workload U, what naming stalls costs: ``initialize(stall_s=1)`` against a process without."""

from __future__ import annotations

from harness import arguments, emit, in_rounds, median_of, median_ratio
from remote_fns import in_child, loader
from workload_fns import images

import meshfeed
from common import measure


def steps_per_s(stalls: bool, seconds: float, smoke: bool) -> float:
    """Steps/s of one fresh process's loader after its warm-up."""
    if stalls:
        meshfeed.initialize(stall_s=1.0)  # alone: its own progress judged every 0.25 s
    fed = loader(meshfeed.ArraySource(images(8_192 if smoke else 50_000)), 512)
    rate = measure(lambda: iter(fed), 1, seconds, warmup=20 if smoke else 300)
    fed.close()
    return rate


def main() -> None:
    args = arguments(__doc__, seconds=3.0, rounds=10, smoke={"seconds": 0.2, "rounds": 1})
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
        steps_per_s={k: round(median_of(per_round, k) or 0.0, 1) for k in entries},
        devices=8,
        processes=1,
    )


if __name__ == "__main__":
    main()
