"""Workload Q, a store's slow tail: hedged range reads against none.

The store is the local S3 server (moto, ``meshfeed.testing.S3Server``) behind a
``CountingProxy`` that holds a share of the range reads (each chosen at random with a
seed; a duplicate is drawn like any request) for some seconds before forwarding them.
The data: a meshfeed folder of 64 shards of 32 rows (a 64-byte row and an int32 label),
read with the per-example shuffle, global batch 32 on 8 CPU devices, one process, the
default read-ahead: ~75 range requests a step, so at 3% nearly every step has a held one.

For each held share (0, 1, 3, 10%) and hold (0.5, 2 s), with ``hedge=True`` (the
default) and ``hedge=False``: the seconds of ``--steps`` steps (after one untimed), the
requests, the duplicates sent and won. Runs in rounds whose order rotates; each run's
time over the round's clean run (no hold, no hedging: the build before), median over
rounds. Goal at 3% x 2 s: <= 1.3x the clean run, duplicates <= 5% of requests.

Then the store's floor (issue 51, part 3): every range read held ``LATENCY_S`` (a far
store that answers late, not a tail), batch ``FLOOR_BATCH``, a loop that computes
``STEP_S`` a step (a sleep); the
share of the time the loop waits on input, with the default read-ahead against fixed
depths, in rotating rounds. Goal: the default waits no more than the best fixed depth.

Prints one JSON line per case; ``--smoke`` for CI.
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
from typing import Any

import jax
import numpy as np

import meshfeed
from meshfeed.testing import CountingProxy, S3Server

SHARES = (0.0, 0.01, 0.03, 0.10)
HOLDS = (0.5, 2.0)
BATCH = 32
LATENCY_S, STEP_S, FLOOR_BATCH = 0.5, 0.1, 8  # a far store; ~16 range reads a step
DEPTHS = ("auto", 2, 4, 16)


def _run(url: str, options: dict[str, Any], proxy: CountingProxy, case: dict[str, Any],
         steps: int, seed: int) -> dict[str, float]:  # fmt: skip
    source = meshfeed.open_source(url, storage_options=options, hedge=case["hedge"])
    loader = meshfeed.Loader(
        source, global_batch_size=BATCH, num_epochs=None, shuffle=True, seed=seed,
        sharding=meshfeed.batch_sharding(meshfeed.make_mesh(data=8)),
    )  # fmt: skip
    it = iter(loader)
    jax.block_until_ready(next(it))
    proxy.hold("range", case["share"], case["hold"], seed=seed)
    loader.stats(reset=True)  # the requests counted from here (this process's, behind URLs)
    start = time.perf_counter()
    for _ in range(steps):
        jax.block_until_ready(next(it))
    seconds = time.perf_counter() - start
    proxy.hold("range", 0.0, 0.0)
    url = loader.stats()["source"]["url"]
    loader.close()
    got = {k: url[k] for k in ("requests", "hedges", "hedges_won")}
    return {"seconds": seconds, **got}


def _waits(url: str, options: dict[str, Any], prefetch: Any, steps: int, seed: int) -> float:
    """The share of ``steps`` steps' time the loop waited on input (after one untimed)."""
    source = meshfeed.open_source(url, storage_options=options)
    loader = meshfeed.Loader(
        source, global_batch_size=FLOOR_BATCH, num_epochs=None, shuffle=True, seed=seed,
        sharding=meshfeed.batch_sharding(meshfeed.make_mesh(data=8)), prefetch=prefetch,
    )  # fmt: skip
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
    got: dict[Any, list[float]] = {d: [] for d in depths}
    for r in range(rounds):
        for d in depths[r % len(depths) :] + depths[: r % len(depths)]:
            got[d].append(_waits(url, options, d, steps, seed=r + 1))
    proxy.hold("range", 0.0, 0.0)
    for d, shares in got.items():
        line = {
            "benchmark": "hedge", "workload": "Q-floor", "prefetch": d, "latency_s": LATENCY_S,
            "step_s": STEP_S, "steps": steps, "rounds": rounds,
            "input_wait": round(statistics.median(shares), 4),
            "smoke": args.smoke, "jax": jax.__version__, "python": platform.python_version(),
        }  # fmt: skip
        print(json.dumps(line), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny, for CI")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--shares", type=float, nargs="+", default=SHARES, help="held shares")
    parser.add_argument("--holds", type=float, nargs="+", default=HOLDS, help="seconds held")
    args = parser.parse_args()
    shares, holds = ((0.0, 0.03), (0.5,)) if args.smoke else (args.shares, args.holds)
    rounds, steps = (1, 3) if args.smoke else (args.rounds, args.steps)
    cases = [{"share": 0.0, "hold": 0.0, "hedge": h} for h in (False, True)]
    for share, hold in ((s, t) for s in shares if s for t in holds):
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
            _run(url, options, proxy, cases[1], 2 * steps, 0)
        runs: list[list[dict[str, float]]] = [[] for _ in cases]
        for r in range(rounds):
            order = list(range(len(cases)))
            order = order[r % len(order) :] + order[: r % len(order)]
            for i in order:
                runs[i].append(_run(url, options, proxy, cases[i], steps, seed=r + 1))
        clean = [run["seconds"] for run in runs[0]]
        for case, got in zip(cases, runs, strict=True):
            ratio = statistics.median(g["seconds"] / c for g, c in zip(got, clean, strict=True))
            requests = sum(g["requests"] for g in got)
            line = {
                "benchmark": "hedge", "workload": "Q", **case, "steps": steps, "rounds": rounds,
                "seconds": round(statistics.median(g["seconds"] for g in got), 3),
                "against_clean": round(ratio, 3),
                "requests": int(requests),
                "duplicates": int(sum(g["hedges"] for g in got)),
                "duplicates_won": int(sum(g["hedges_won"] for g in got)),
                "duplicate_share": round(sum(g["hedges"] for g in got) / max(requests, 1), 4),
                "smoke": args.smoke, "jax": jax.__version__, "python": platform.python_version(),
            }  # fmt: skip
            print(json.dumps(line), flush=True)
        _floor(url, options, proxy, args)
    finally:
        proxy.close()
        server.close()


if __name__ == "__main__":
    main()
