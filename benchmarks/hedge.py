"""Workload Q, a store's slow tail: hedged range reads against none, each against the clean
run; ``Q-floor``: every read held, the default read-ahead's input wait against fixed depths."""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from harness import arguments, emit, in_rounds, median_of, median_ratio, use_cpu_devices
from remote_fns import loader, s3_store

import meshfeed

SHARES = (0.0, 0.01, 0.03, 0.10)
HOLDS = (0.5, 2.0)
BATCH = 32
LATENCY_S = 0.5  # the floor: a far store; ~16 range reads a step
STEP_S = 0.1
FLOOR_BATCH = 8
DEPTHS = ("auto", 2, 4, 16)
URL = "s3://data/tail"
COUNTED = ("requests", "hedges", "hedges_won")


def round_seeds(entries: int) -> Callable[[], int]:
    """A seed for each call of ``entries`` entries run in rounds: the round's number + 1."""
    calls = itertools.count()
    return lambda: 1 + next(calls) // entries


def _timed(proxy: Any, source: Any, seed: int, steps: int, held: Any, step_s: float, **kw: Any):
    """One batch of a shuffled endless loader, then ``held`` (share, seconds) of the range
    reads held and ``steps`` timed, each with ``step_s`` of compute: its stats, seconds."""
    feed = loader(source, shuffle=True, seed=seed, **kw)
    it = iter(feed)
    jax.block_until_ready(next(it))
    if held:
        proxy.hold("range", *held, seed=seed)
    feed.stats(reset=True)  # the requests counted from here (this process's, behind URLs)
    start = time.perf_counter()
    for _ in range(steps):
        jax.block_until_ready(next(it))
        if step_s:
            time.sleep(step_s)  # the step's compute
    seconds = time.perf_counter() - start
    if held:
        proxy.hold("range", 0.0, 0.0)
    stats = feed.stats()
    feed.close()
    return stats, seconds


def _run(proxy: Any, options: Any, case: dict[str, Any], steps: int, seed: int) -> dict[str, float]:
    source = meshfeed.open_source(URL, storage_options=options, hedge=case["hedge"])
    held = (case["share"], case["hold"])
    stats, seconds = _timed(proxy, source, seed, steps, held, 0.0, batch=BATCH)
    return {"seconds": seconds, **{k: stats["source"]["url"][k] for k in COUNTED}}


def _waits(proxy: Any, options: Any, prefetch: Any, steps: int, seed: int) -> float:
    """The share of ``steps`` steps' time the loop waited on input (after one untimed)."""
    source = meshfeed.open_source(URL, storage_options=options)
    fed = {"batch": FLOOR_BATCH, "prefetch": prefetch}
    stats, seconds = _timed(proxy, source, seed, steps, None, STEP_S, **fed)
    return stats["consumer"]["wait_seconds"] / seconds


def _floor(options: Any, proxy: Any, args: argparse.Namespace) -> None:
    rounds, steps = (1, 5) if args.smoke else (args.rounds, 4 * args.steps)
    depths = DEPTHS[:2] if args.smoke else DEPTHS
    seed = round_seeds(len(depths))
    entries = {str(d): lambda d=d: _waits(proxy, options, d, steps, seed()) for d in depths}
    proxy.hold("range", 1.0, LATENCY_S)
    per_round = in_rounds(entries, rounds, pause=0.0)
    proxy.hold("range", 0.0, 0.0)
    head = {"workload": "Q-floor", "latency_s": LATENCY_S, "step_s": STEP_S, "steps": steps}
    for d in depths:
        wait = round(median_of(per_round, str(d)) or 0.0, 4)
        emit("hedge", smoke=args.smoke, **head, prefetch=d, rounds=rounds, input_wait=wait)


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
        rng = np.random.default_rng(0)
        x = rng.integers(0, 255, (64 * 32, 64), dtype=np.uint8)
        data = {"x": x, "y": np.arange(64 * 32, dtype=np.int32)}
        meshfeed.write_source(URL, data, shard_size=32, storage_options=server.storage_options)
        if not args.smoke:  # the store's latencies learned
            _run(proxy, options, cases[1], 2 * args.steps, 0)
        seed = round_seeds(len(cases))
        entries = {
            str(i): lambda c=case: _run(proxy, options, c, args.steps, seed())
            for i, case in enumerate(cases)
        }
        per_round = in_rounds(entries, args.rounds, pause=0.0)
        for i, case in enumerate(cases):
            got = {k: sum(r[str(i)][k] for r in per_round) for k in COUNTED}
            emit(
                "hedge",
                smoke=args.smoke,
                workload="Q",
                **case,
                steps=args.steps,
                rounds=args.rounds,
                seconds=round(median_of(per_round, str(i), "seconds") or 0.0, 3),
                against_clean=median_ratio(per_round, str(i), "0", "seconds"),
                requests=int(got["requests"]),
                duplicates=int(got["hedges"]),
                duplicates_won=int(got["hedges_won"]),
                duplicate_share=round(got["hedges"] / max(got["requests"], 1), 4),
            )
        _floor(options, proxy, args)


if __name__ == "__main__":
    main()
