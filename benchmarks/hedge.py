"""Workload Q, a store's slow tail: hedged range reads against none; Q-floor: every read held."""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from harness import arguments, emit, in_rounds, median_ratio, use_cpu_devices
from remote_fns import figures, loader, s3_store

import meshfeed

SHARES = (0.0, 0.01, 0.03, 0.10)
HOLDS = (0.5, 2.0)
BATCH = 32
LATENCY_S = 0.5  # the floor: a far store; ~16 range reads a step
STEP_S = 0.1
FLOOR_BATCH = 8
DEPTHS = ("auto", 2, 4, 16)
URL = "s3://data/tail"
COUNTED = {"requests": "requests", "hedges": "duplicates", "hedges_won": "duplicates_won"}


def round_seeds(entries: int) -> Callable[[], int]:
    """A seed for each call of ``entries`` entries run in rounds: the round's number + 1."""
    calls = itertools.count()
    return lambda: 1 + next(calls) // entries


def _timed(proxy: Any, options: Any, steps: int, seed: int, case: dict[str, Any]) -> dict[str, Any]:
    """A shuffled endless loader's first batch, then ``steps`` timed with ``case``'s share of
    range reads held ``hold`` s and ``step_s`` of compute a step: seconds, input wait, counts."""
    c = {"hedge": True, "share": 0.0, "step_s": 0.0, "batch": BATCH, "prefetch": "auto", **case}
    source = meshfeed.open_source(URL, storage_options=options, hedge=c["hedge"])
    feed = loader(source, c["batch"], shuffle=True, seed=seed, prefetch=c["prefetch"])
    it = iter(feed)
    jax.block_until_ready(next(it))
    if c["share"]:
        proxy.hold("range", c["share"], c["hold"], seed=seed)
    feed.stats(reset=True)  # the requests counted from here (this process's, behind URLs)
    start = time.perf_counter()
    for _ in range(steps):
        jax.block_until_ready(next(it))
        if c["step_s"]:
            time.sleep(c["step_s"])  # the step's compute
    seconds = time.perf_counter() - start
    if c["share"]:
        proxy.hold("range", 0.0, 0.0)
    stats = feed.stats()
    feed.close()
    got = {"seconds": seconds, "input_wait": stats["consumer"]["wait_seconds"] / seconds}
    return got | {k: stats["source"]["url"][k] for k in COUNTED}


def _floor(options: Any, proxy: Any, args: argparse.Namespace) -> None:
    rounds, steps = (1, 5) if args.smoke else (args.rounds, 4 * args.steps)
    depths = DEPTHS[:2] if args.smoke else DEPTHS
    seed = round_seeds(len(depths))
    cases = {str(d): {"batch": FLOOR_BATCH, "prefetch": d, "step_s": STEP_S} for d in depths}
    entries = {d: lambda c=c: _timed(proxy, options, steps, seed(), c) for d, c in cases.items()}
    proxy.hold("range", 1.0, LATENCY_S)
    per_round = in_rounds(entries, rounds, pause=0.0)
    proxy.hold("range", 0.0, 0.0)
    head = {"workload": "Q-floor", "latency_s": LATENCY_S, "step_s": STEP_S, "steps": steps}
    for d in depths:
        wait = figures(per_round, str(d), {"input_wait": 4})
        emit("hedge", smoke=args.smoke, **head, prefetch=d, rounds=rounds, **wait)


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--shares", type=float, nargs="+", default=SHARES, help="held shares")
    parser.add_argument("--holds", type=float, nargs="+", default=HOLDS, help="seconds held")


def main() -> None:
    use_cpu_devices()
    smoke = {"shares": (0.0, 0.03), "holds": (0.5,), "rounds": 1, "steps": 3}
    args = arguments(__doc__, rounds=3, smoke=smoke, add=_flags)
    held = [(0.0, 0.0)] + [(s, t) for s in args.shares if s for t in args.holds]
    cases = [{"share": s, "hold": t, "hedge": h} for s, t in held for h in (False, True)]
    with s3_store() as (server, proxy, options):
        x = np.random.default_rng(0).integers(0, 255, (64 * 32, 64), dtype=np.uint8)
        data = {"x": x, "y": np.arange(64 * 32, dtype=np.int32)}
        meshfeed.write_source(URL, data, shard_size=32, storage_options=server.storage_options)
        if not args.smoke:  # the store's latencies learned
            _timed(proxy, options, 2 * args.steps, 0, cases[1])
        seed = round_seeds(len(cases))
        entries = {
            str(i): lambda c=case: _timed(proxy, options, args.steps, seed(), c)
            for i, case in enumerate(cases)
        }
        per_round = in_rounds(entries, args.rounds, pause=0.0)
        head = {"workload": "Q", "steps": args.steps, "rounds": args.rounds}
        for i, case in enumerate(cases):
            got = {shown: int(sum(r[str(i)][k] for r in per_round)) for k, shown in COUNTED.items()}
            share = round(got["duplicates"] / max(got["requests"], 1), 4)
            line = {**head, **case, **figures(per_round, str(i), {"seconds": 3}), **got}
            against = median_ratio(per_round, str(i), "0", "seconds")
            emit("hedge", smoke=args.smoke, **line, against_clean=against, duplicate_share=share)
        _floor(options, proxy, args)


if __name__ == "__main__":
    main()
