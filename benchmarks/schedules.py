"""Schedules: what weights by stage and a batch size that ramps cost per step.

A mixture of three sources of 400k examples each read by a ``Loader`` on one process
with 8 CPU devices, with and without schedules, in the same run. The sources are the
same size so that what differs is the schedule, not which source a draw falls in (a
source's size sets the cost of its permutation and of its gathers); the run's 5.1M
positions read each source in several passes.

- **ids**: example ids resolved per second -- the loader's ids of a step, then the
  mixture's source and example of each -- the whole schedule path, no data read.
  ``fixed``: fixed weights, the loader shuffling positions (today's mixture);
  ``fixed_in_order``: the same read position by position; ``staged``: four weight
  stages, one reached by a blend over 1,000 steps, read in order; ``ramp``: fixed
  weights, a batch size 64 -> 128 -> 256; ``staged_ramp``: both. Every contender reads
  steps of 256 ids (a ramp from its last stage on: a smaller step costs more per id
  with or without a schedule), each window going on where its last one stopped.
- **batches**: rows per second as global ``jax.Array`` batches (every field read and
  placed on the devices), ``fixed`` against ``ramp`` and ``staged_ramp``, from step
  12,000, where all three read 256 rows a step in the same proportions.

Each contender runs in windows of at least ``--seconds`` seconds, in rounds whose order
rotates; the figures are medians, the ratios medians of the per-round ratios against
``fixed``. Prints one JSON line per measurement; ``--smoke`` for CI.
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
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

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


def sources(scale: int) -> list[meshfeed.ArraySource]:
    out = []
    for tag, n in enumerate([400_000 // scale] * 3):
        rng = np.random.default_rng(tag)
        out.append(
            meshfeed.ArraySource(
                {
                    "id": np.arange(n, dtype=np.int32),
                    "x": rng.normal(size=(n, 16)).astype(np.float32),
                }
            )
        )
    return out


def loaders(scale: int) -> dict[str, Callable[[], meshfeed.Loader]]:
    src = sources(scale)
    sharding = meshfeed.batch_sharding(meshfeed.make_mesh(data=jax.device_count()))
    fixed_weights = STAGES[0][1]

    def make(weights: Any, batch: Any, shuffle: bool) -> Callable[[], meshfeed.Loader]:
        def build() -> meshfeed.Loader:
            mixture = meshfeed.mix(src, weights, length=LENGTH)
            return meshfeed.Loader(
                mixture, global_batch_size=batch, sharding=sharding, shuffle=shuffle
            )

        return build

    return {
        "fixed": make(fixed_weights, BATCH, True),
        "fixed_in_order": make(fixed_weights, BATCH, False),
        "staged": make(STAGES, BATCH, False),
        "ramp": make(fixed_weights, RAMP, True),
        "staged_ramp": make(STAGES, RAMP, False),
    }


_AT: dict[int, int] = {}  # where each loader's ids left off: windows go on through the run


def ids_rate(build: Callable[[], meshfeed.Loader], seconds: float) -> float:
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
    while True:
        ids = loader.ids(k)
        locate(ids)
        done += len(ids)
        k = k + 1 if k + 1 < steps else first
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            _AT[id(build)] = k
            return done / elapsed


BATCHES_FROM = 12_000  # past the ramp, in the stage whose weights are the fixed ones


def batches_rate(build: Callable[[], meshfeed.Loader], seconds: float) -> float:
    """Rows per second as placed global batches, from step ``BATCHES_FROM``: every
    contender reads steps of 256 rows in the same proportions there, so what differs is
    the schedule."""

    def run() -> Iterator[Any]:
        loader = build()
        loader.restore({**loader.state(), "step": BATCHES_FROM})
        return iter(loader)

    return measure(run, BATCH, seconds)


def compare(
    contenders: dict[str, Callable[[], meshfeed.Loader]],
    rate: Callable[[Callable[[], meshfeed.Loader], float], float],
    rounds: int,
    seconds: float,
) -> dict[str, float]:
    names = list(contenders)
    rates: dict[str, list[float]] = {n: [] for n in names}
    ratios: dict[str, list[float]] = {n: [] for n in names if n != "fixed"}
    for r in range(rounds):
        got = {}
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            got[name] = rate(contenders[name], seconds)
            rates[name].append(got[name])
        for name in ratios:
            ratios[name].append(got[name] / got["fixed"])
    out: dict[str, float] = {f"{n}_per_s": round(statistics.median(v)) for n, v in rates.items()}
    out.update({f"{n}_ratio": round(statistics.median(v), 3) for n, v in ratios.items()})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny run for CI")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.5)
    args = parser.parse_args()
    rounds, seconds, scale = (1, 0.3, 20) if args.smoke else (args.rounds, args.seconds, 1)
    common = {
        "benchmark": "schedules",
        "smoke": args.smoke,
        "global_batch_size": BATCH,
        "rounds": rounds,
        "window_s": seconds,
        "jax": jax.__version__,
        "python": platform.python_version(),
    }
    every = loaders(scale)
    line = {**common, "name": "ids", **compare(every, ids_rate, rounds, seconds)}
    print(json.dumps(line), flush=True)
    pair = {n: every[n] for n in ("fixed", "ramp", "staged_ramp")}
    line = {**common, "name": "batches", **compare(pair, batches_rate, rounds, seconds)}
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
