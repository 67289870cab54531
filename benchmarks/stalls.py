"""Workload U, what naming stalls costs: a process's progress, made and judged every few seconds.

``meshfeed.initialize(stall_s=...)`` has every process make its progress (its step and
its longest wait) every ``min(5, stall_s / 4)`` seconds and send it to process 0, which
judges it; a process alone judges its own. Here, in fresh processes of one process
each, 8 CPU devices: workload H's loader (50,000 rows of 32x32x3 uint8 in memory, batch
512, defaults) after ``meshfeed.initialize(stall_s=1)`` (progress every 0.25 s, 20 times
the default rate) against one in a process that never called it, steps/s over a window
of ``--seconds`` after 300 steps of warm-up, in rounds whose order rotates; the median
of per-round ratios (goal >= 0.99).

Prints one JSON line; ``--smoke`` for CI.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time


def _child(stalls: bool, seconds: float, smoke: bool) -> float:
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
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
        source, global_batch_size=512, num_epochs=None,
        sharding=meshfeed.batch_sharding(meshfeed.make_mesh(data=8)),
    )  # fmt: skip
    it = iter(loader)
    for _ in range(20 if smoke else 300):
        jax.block_until_ready(next(it))
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        jax.block_until_ready(next(it))
        done += 1
    rate = done / (time.perf_counter() - start)
    loader.close()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny, for CI")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--child", choices=["on", "off"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    rounds, seconds = (1, 0.2) if args.smoke else (args.rounds, args.seconds)
    if args.child:
        print(json.dumps({"steps_per_s": _child(args.child == "on", seconds, args.smoke)}))
        return
    rates: dict[str, list[float]] = {"on": [], "off": []}
    for r in range(rounds):
        for name in ["on", "off"] if r % 2 == 0 else ["off", "on"]:
            cmd = [sys.executable, __file__, "--child", name, "--seconds", str(seconds)]
            cmd += ["--smoke"] if args.smoke else []
            out = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if out.returncode:
                sys.exit(out.stderr[-3000:])
            rates[name].append(json.loads(out.stdout.strip().splitlines()[-1])["steps_per_s"])
    ratio = statistics.median(a / b for a, b in zip(rates["on"], rates["off"], strict=True))
    from importlib.metadata import version

    print(json.dumps({
        "benchmark": "stalls", "workload": "U", "rounds": rounds, "seconds": seconds,
        "every_s": 0.25, "on_against_off": round(ratio, 3),
        "steps_per_s": {k: round(statistics.median(v), 1) for k, v in rates.items()},
        "smoke": args.smoke, "jax": version("jax"), "python": platform.python_version(),
    }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
