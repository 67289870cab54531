"""Schedules, workload X of README.md: what weights by stage and a batch size that ramps
cost per step, ids/s and rows/s as placed global batches, as ratios to ``fixed``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import numpy as np
from harness import arguments, emit, in_rounds, median_of, median_ratio, use_cpu_devices

import meshfeed
from common import measure

BATCH = 256
RAMP = [(0, 64), (2_000, 128), (4_000, BATCH)]
STAGES = [
    (0, [0.6, 0.3, 0.1]),
    (3_000, [0.2, 0.5, 0.3], 1_000),
    (8_000, [0.1, 0.1, 0.8]),
    (12_000, [0.6, 0.3, 0.1]),  # the fixed weights again: batches are timed here
]
LENGTH = 20_000 * BATCH  # positions in the run: past every stage start
BATCHES_FROM = 12_000  # past the ramp, in the stage whose weights are the fixed ones
Build = Callable[[], meshfeed.Loader]


def loaders(scale: int) -> dict[str, Build]:
    n = 400_000 // scale
    ids = np.arange(n, dtype=np.int32)
    xs = [np.random.default_rng(tag).normal(size=(n, 16)).astype(np.float32) for tag in range(3)]
    sources = [meshfeed.ArraySource({"id": ids, "x": x}) for x in xs]
    sharding = meshfeed.batch_sharding(meshfeed.make_mesh(data=jax.device_count()))

    def build(weights: Any, batch: Any, shuffle: bool) -> meshfeed.Loader:
        mixture = meshfeed.mix(sources, weights, length=LENGTH)
        return meshfeed.Loader(mixture, global_batch_size=batch, sharding=sharding, shuffle=shuffle)

    fixed = STAGES[0][1]
    return {
        "fixed": partial(build, fixed, BATCH, True),
        "fixed_in_order": partial(build, fixed, BATCH, False),
        "staged": partial(build, STAGES, BATCH, False),
        "ramp": partial(build, fixed, RAMP, True),
        "staged_ramp": partial(build, STAGES, RAMP, False),
    }


_AT: dict[int, int] = {}  # where each loader's ids left off: windows go on through the run


def ids_rate(build: Build, seconds: float) -> float:
    """Ids resolved to (source, example) per second, over at least ``seconds``, on the
    steps after the last window's (so the rounds go through every stage and blend)."""
    loader = build()
    locate = loader.source.locate  # type: ignore[attr-defined]
    steps = len(loader)
    # A ramp's early steps are smaller, and a smaller step costs more per id with or
    # without a schedule: compare steps of the same size, from the ramp's last stage on.
    first = RAMP[-1][0] if loader.options.ramp else 0
    k = _AT.get(id(build), first)
    done = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        ids = loader.ids(k)
        locate(ids)
        done += len(ids)
        k = k + 1 if k + 1 < steps else first
    _AT[id(build)] = k
    return done / (time.perf_counter() - start)


def batches_rate(build: Build, seconds: float) -> float:
    """Rows per second as placed global batches, from step ``BATCHES_FROM``, where every
    contender reads steps of 256 rows in the same proportions: what differs is the schedule."""

    def run() -> Any:
        loader = build()
        loader.restore({**loader.state(), "step": BATCHES_FROM})
        return iter(loader)

    return measure(run, BATCH, seconds)


def compare(
    contenders: dict[str, Build], rate: Callable[[Build, float], float], args: Any
) -> dict[str, Any]:
    entries = {n: partial(rate, build, args.seconds) for n, build in contenders.items()}
    per_round = in_rounds(entries, args.rounds)
    out: dict[str, Any] = {f"{n}_per_s": round(median_of(per_round, n) or 0) for n in entries}
    for name in [n for n in entries if n != "fixed"]:
        out[f"{name}_ratio"] = median_ratio(per_round, name, "fixed") or 0.0
    return out


def main() -> None:
    use_cpu_devices()
    args = arguments(__doc__, seconds=0.5, rounds=7)
    every = loaders(20 if args.smoke else 1)
    run = {"smoke": args.smoke, "global_batch_size": BATCH, "rounds": args.rounds}
    run["window_s"] = args.seconds
    emit("schedules", name="ids", **run, **compare(every, ids_rate, args))
    pair = {n: every[n] for n in ("fixed", "ramp", "staged_ramp")}
    emit("schedules", name="batches", **run, **compare(pair, batches_rate, args))


if __name__ == "__main__":
    main()
