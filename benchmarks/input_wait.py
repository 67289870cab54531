"""Workload E, input wait: a small convnet trained by ``fit``; time spent waiting for input.

One process, 8 CPU devices, scikit-learn's digits (global batch 64), a convnet of the
demo's shape (``common.digits_loss``, mode ``"jit"``), trained for a fixed number of
steps by ``meshfeed.fit`` with the loader's ``prefetch`` at 0, 2 and ``"auto"`` (the
default), on three sources:

- ``memory``: the digits in memory (reading a batch takes microseconds);
- ``remote 2ms`` and ``remote 20ms``: the same digits behind 2 ms or 20 ms of latency
  per read, as a batch fetched from a network file system or an object store would be.

Each line has ``input_wait_share`` (devices idle while the loop waited for the next
batch: time in ``next(loader)`` after the previous step had finished, the climb of
``"auto"`` included), ``loader_share`` (all time in ``next(loader)``, most of it
overlapping the step before), samples/s, the read-ahead depth at the end and the most
bytes it held (``prefetch_peak_bytes``) against ``prefetch_bytes``.

Goal: input wait <= 2% with the default settings at 2 ms and 20 ms, within
``prefetch_bytes``. Prints one JSON line per measurement; ``--smoke`` for CI.
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

import jax

import meshfeed
from common import DIGITS_BATCH_SIZE as GLOBAL_BATCH_SIZE
from common import Remote, digits, fit_digits

LATENCIES_S = {"memory": 0.0, "remote 2ms": 0.002, "remote 20ms": 0.020}


def run(source: str, prefetch: meshfeed.types.Prefetch, steps: int) -> dict[str, float]:
    train = digits()
    mesh = meshfeed.make_mesh(data=8)
    data = meshfeed.ArraySource(train)
    latency = LATENCIES_S[source]
    loader = meshfeed.Loader(
        Remote(data, latency) if latency else data,
        global_batch_size=GLOBAL_BATCH_SIZE,
        sharding=meshfeed.batch_sharding(mesh),
        num_epochs=None,
        prefetch=prefetch,
    )
    history = fit_digits(loader, steps)
    return {
        "input_wait_share": history.input_wait_share,
        "loader_share": history.loader_share,
        "samples_per_s": history.samples_per_s,
        "prefetch_depth": float(loader.prefetch_depth),
        "prefetch_peak_bytes": float(loader.prefetch_peak_bytes),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny run for CI")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--default-only", action="store_true", help='prefetch="auto" alone')
    args = parser.parse_args()
    steps, rounds = (20, 1) if args.smoke else (args.steps, args.rounds)
    settings: tuple[meshfeed.types.Prefetch, ...] = (
        ("auto",) if args.default_only else (0, 2, "auto")
    )
    results: dict[tuple[str, meshfeed.types.Prefetch], list[dict[str, float]]] = {
        (source, p): [] for source in LATENCIES_S for p in settings
    }
    for _ in range(rounds):
        for source, prefetch in results:
            results[source, prefetch].append(run(source, prefetch, steps))
    for (source, prefetch), runs in results.items():
        print(
            json.dumps(
                {
                    "benchmark": "input_wait",
                    "workload": "E" if source == "memory" else f"E {source}",
                    "name": f"fit:{source}:prefetch={prefetch}",
                    "source": source,
                    "latency_ms": 1000 * LATENCIES_S[source],
                    "prefetch": prefetch,
                    "default": prefetch == "auto",
                    "input_wait_share": round(
                        statistics.median(r["input_wait_share"] for r in runs), 4
                    ),
                    "loader_share": round(statistics.median(r["loader_share"] for r in runs), 4),
                    "samples_per_s": round(statistics.median(r["samples_per_s"] for r in runs)),
                    "prefetch_depth": round(statistics.median(r["prefetch_depth"] for r in runs)),
                    "prefetch_peak_bytes": round(max(r["prefetch_peak_bytes"] for r in runs)),
                    "prefetch_bytes": meshfeed.types.LoaderOptions.prefetch_bytes,
                    "steps": steps,
                    "global_batch_size": GLOBAL_BATCH_SIZE,
                    "devices": jax.device_count(),
                    "processes": jax.process_count(),
                    "smoke": args.smoke,
                    "jax": jax.__version__,
                    "python": platform.python_version(),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
