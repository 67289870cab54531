"""What counting costs: ``loader.stats()``'s counters against the steps they count.

The counters are always on, so their cost is estimated from their count and their price
rather than against a build without them: each stage adds to its counters once per call
(a step, a chunk), never per record. ``loader.stats()["counter_updates"]`` says how many
adds a run made; one add, as wide as the widest a stage makes (the consumer's, ten
amounts), with the two clock reads that time a stage around it, is timed alone
(``meshfeed.testing.counter_price``: meshfeed's own counter, a million adds, best of
five). The share is ``updates a step x price of one / the step's time``, on the
cheapest steps meshfeed makes
(an in-memory source, 8 CPU devices, no training: whatever a step does besides, the
share only falls): ``plain`` (no transform), ``record`` (a record transform in the
loading threads) and ``threads`` (a record transform on 2 worker threads, and a batch
transform). Each case's step time is the median of rounds of at least 0.3 s. Goal:
share <= 1%. ``--against SRC`` also times this build against the meshfeed in ``SRC`` (a
checkout of the commit before the counters, say: ``git worktree add /tmp/base <rev>``),
the ``plain`` case with ``prefetch=2``, each side in a fresh process, the order rotating,
20 rounds of three 0.6 s windows: the median of the per-round ratios. Prints one JSON
line per case; ``--smoke`` for CI.
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
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

import meshfeed

N, WIDTH, BATCH = 1 << 16, 32, 256
GOAL = 0.01


def _double(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    return {"x": record["x"] * 2, "y": record["y"]}


CASES: dict[str, dict[str, Any]] = {
    "plain": {},
    "record": {"record_transform": _double},
    "threads": {
        "record_transform": _double,
        "num_workers": 2,
        "worker_type": "threads",
        "transform": lambda batch: batch,
    },
}


def step_time(case: dict[str, Any], source: meshfeed.ArraySource, rounds: int, window: float):
    """The median over rounds of seconds a step, and the counter adds a step."""
    mesh = meshfeed.make_mesh(data=jax.device_count())
    loader = meshfeed.Loader(
        source,
        global_batch_size=BATCH,
        sharding=meshfeed.batch_sharding(mesh),
        num_epochs=None,
        **case,
    )
    batches = iter(loader)
    for _ in range(20):  # warm: threads started, depth settled
        next(batches)
    per_step = []
    for _ in range(rounds):
        began, steps = time.perf_counter(), 0
        while time.perf_counter() - began < window:
            jax.block_until_ready(next(batches))
            steps += 1
        per_step.append((time.perf_counter() - began) / steps)
    total = loader.stats()["counter_updates"] if hasattr(loader, "stats") else 0
    loader.close()
    return statistics.median(per_step), total, loader.step


def _source() -> meshfeed.ArraySource:
    rng = np.random.default_rng(0)
    return meshfeed.ArraySource(
        {"x": rng.random((N, WIDTH), dtype=np.float32), "y": np.arange(N, dtype=np.int64)}
    )


def child(window: float) -> None:
    """Steps/s of the ``plain`` case with ``prefetch=2`` (no depth to settle), the median
    of three windows: what one side of ``--against`` measures, in a process of its own
    (on a build without ``loader.stats``, too)."""
    seconds, _, _ = step_time({"prefetch": 2}, _source(), 3, window)
    print(1.0 / seconds)


def against(src: str, rounds: int, window: float) -> None:
    """This build against the meshfeed in ``src`` (a build without the counters: the
    commit before them), each side in a fresh process, the order rotating by round."""
    here = str(Path(meshfeed.__file__).resolve().parents[1])
    ratios = []
    for r in range(rounds):
        sides = [("here", here), ("there", src)][:: 1 if r % 2 == 0 else -1]
        got = {}
        for name, path in sides:
            env = {**os.environ, "PYTHONPATH": path}
            command = [sys.executable, __file__, "--child", "--window", str(window)]
            run = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
            got[name] = float(run.stdout.split()[-1])
        ratios.append(got["here"] / got["there"])
    line = {
        "bench": "stats",
        "case": "plain, prefetch=2",
        "against": src,
        "ratio": round(statistics.median(ratios), 4),
        "ratio_by_round": [round(r, 3) for r in ratios],
        "rounds": rounds,
        "window_s": window,
        "python": platform.python_version(),
        "jax": jax.__version__,
    }
    print(json.dumps(line), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny run for CI")
    parser.add_argument("--against", metavar="SRC", help="also time against this src/ folder")
    parser.add_argument("--rounds", type=int, default=20, help="rounds of --against")
    parser.add_argument("--window", type=float, default=0.6, help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.window)
    rounds, window, times = (2, 0.05, 20_000) if args.smoke else (7, 0.5, 1_000_000)
    source = _source()
    from meshfeed.testing import counter_price  # here: --child runs on builds without it

    price = counter_price(times)
    for name, case in CASES.items():
        seconds, updates, steps = step_time(case, source, rounds, window)
        per_step = updates / steps
        share = per_step * price / seconds
        line = {
            "bench": "stats",
            "case": name,
            "step_ms": round(1000 * seconds, 4),
            "updates_per_step": round(per_step, 2),
            "update_us": round(1e6 * price, 3),
            "share": round(share, 5),
            "goal": GOAL,
            "met": share <= GOAL,
            "rounds": rounds,
            "window_s": window,
            "devices": jax.device_count(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "jax": jax.__version__,
            "smoke": args.smoke,
        }
        print(json.dumps(line), flush=True)
    if args.against:
        against(args.against, 2 if args.smoke else args.rounds, 0.05 if args.smoke else 0.6)


if __name__ == "__main__":
    main()
