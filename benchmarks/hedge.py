"""Workload Q, a store's slow tail: hedged range reads against none.

A folder on moto's S3 server behind a ``CountingProxy`` that holds a share of the range
reads; ``hedge=True`` and ``hedge=False`` against the clean run, rotating rounds. Goal at
3% x 2 s: <= 1.3x the clean run, duplicates <= 5% of requests. ``Q-floor``: every read
held, the default read-ahead's input wait against fixed depths. ``--smoke`` for CI; the
workload is in ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from harness import arguments, emit, in_rounds, median_of, median_ratio, use_cpu_devices

import meshfeed
from meshfeed.testing import CountingProxy, S3Server

SHARES = (0.0, 0.01, 0.03, 0.10)
HOLDS = (0.5, 2.0)
BATCH = 32
LATENCY_S = 0.5  # the floor: a far store; ~16 range reads a step
STEP_S = 0.1
FLOOR_BATCH = 8
DEPTHS = ("auto", 2, 4, 16)


def round_seeds(entries: int) -> Callable[[], int]:
    """A seed for each call of ``entries`` entries run in rounds: the round's number + 1."""
    calls = itertools.count()
    return lambda: 1 + next(calls) // entries


def _loader(url: str, options: dict[str, Any], seed: int, **kwargs: Any) -> meshfeed.Loader:
    hedge = kwargs.pop("hedge", True)
    return meshfeed.Loader(
        meshfeed.open_source(url, storage_options=options, hedge=hedge),
        num_epochs=None,
        shuffle=True,
        seed=seed,
        sharding=meshfeed.batch_sharding(meshfeed.make_mesh(data=8)),
        **kwargs,
    )


def _run(
    url: str,
    options: dict[str, Any],
    proxy: CountingProxy,
    case: dict[str, Any],
    steps: int,
    seed: int,
) -> dict[str, float]:
    loader = _loader(url, options, seed, global_batch_size=BATCH, hedge=case["hedge"])
    it = iter(loader)
    jax.block_until_ready(next(it))
    proxy.hold("range", case["share"], case["hold"], seed=seed)
    loader.stats(reset=True)  # the requests counted from here (this process's, behind URLs)
    start = time.perf_counter()
    for _ in range(steps):
        jax.block_until_ready(next(it))
    seconds = time.perf_counter() - start
    proxy.hold("range", 0.0, 0.0)
    url_stats = loader.stats()["source"]["url"]
    loader.close()
    got = {k: url_stats[k] for k in ("requests", "hedges", "hedges_won")}
    return {"seconds": seconds, **got}


def _waits(url: str, options: dict[str, Any], prefetch: Any, steps: int, seed: int) -> float:
    """The share of ``steps`` steps' time the loop waited on input (after one untimed)."""
    loader = _loader(url, options, seed, global_batch_size=FLOOR_BATCH, prefetch=prefetch)
    it = iter(loader)
    jax.block_until_ready(next(it))
    loader.stats(reset=True)
    start = time.perf_counter()
    for _ in range(steps):
        jax.block_until_ready(next(it))
        time.sleep(STEP_S)  # the step's compute
    seconds = time.perf_counter() - start
    waited = loader.stats()["consumer"]["wait_seconds"]
    loader.close()
    return waited / seconds


def _floor(url: str, options: dict[str, Any], proxy: CountingProxy, args: Any) -> None:
    rounds, steps = (1, 5) if args.smoke else (args.rounds, 4 * args.steps)
    proxy.hold("range", 1.0, LATENCY_S)
    depths = DEPTHS[:2] if args.smoke else DEPTHS
    seed = round_seeds(len(depths))
    entries = {str(d): lambda d=d: _waits(url, options, d, steps, seed()) for d in depths}
    per_round = in_rounds(entries, rounds, pause=0.0)
    proxy.hold("range", 0.0, 0.0)
    for d in depths:
        emit(
            "hedge",
            smoke=args.smoke,
            workload="Q-floor",
            prefetch=d,
            latency_s=LATENCY_S,
            step_s=STEP_S,
            steps=steps,
            rounds=rounds,
            input_wait=round(median_of(per_round, str(d)) or 0.0, 4),
        )


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--shares", type=float, nargs="+", default=SHARES, help="held shares")
    parser.add_argument("--holds", type=float, nargs="+", default=HOLDS, help="seconds held")


def main() -> None:
    use_cpu_devices()
    smoke = {"shares": (0.0, 0.03), "holds": (0.5,), "rounds": 1, "steps": 3}
    args = arguments(__doc__, rounds=3, smoke=smoke, add=_flags)
    cases = [{"share": 0.0, "hold": 0.0, "hedge": h} for h in (False, True)]
    for share, hold in ((s, t) for s in args.shares if s for t in args.holds):
        cases += [{"share": share, "hold": hold, "hedge": h} for h in (False, True)]
    server = S3Server()
    proxy = CountingProxy(server.port)
    try:
        server.make_bucket("data")
        rng = np.random.default_rng(0)
        data = {
            "x": rng.integers(0, 255, (64 * 32, 64), dtype=np.uint8),
            "y": np.arange(64 * 32, dtype=np.int32),
        }
        url = "s3://data/tail"
        meshfeed.write_source(url, data, shard_size=32, storage_options=server.storage_options)
        options = {**server.storage_options, "endpoint_url": proxy.endpoint}
        if not args.smoke:  # the store's latencies learned
            _run(url, options, proxy, cases[1], 2 * args.steps, 0)
        seed = round_seeds(len(cases))
        entries = {
            str(i): lambda c=case: _run(url, options, proxy, c, args.steps, seed())
            for i, case in enumerate(cases)
        }
        per_round = in_rounds(entries, args.rounds, pause=0.0)
        for i, case in enumerate(cases):
            got = [r[str(i)] for r in per_round]
            requests = sum(g["requests"] for g in got)
            hedges = sum(g["hedges"] for g in got)
            emit(
                "hedge",
                smoke=args.smoke,
                workload="Q",
                **case,
                steps=args.steps,
                rounds=args.rounds,
                seconds=round(median_of(per_round, str(i), "seconds") or 0.0, 3),
                against_clean=median_ratio(per_round, str(i), "0", "seconds"),
                requests=int(requests),
                duplicates=int(hedges),
                duplicates_won=int(sum(g["hedges_won"] for g in got)),
                duplicate_share=round(hedges / max(requests, 1), 4),
            )
        _floor(url, options, proxy, args)
    finally:
        proxy.close()
        server.close()


if __name__ == "__main__":
    main()
