"""Workload E, input wait: a small convnet trained by ``fit``; time spent waiting for input.

One process, 8 CPU devices, scikit-learn's digits (global batch 64), a convnet of the
demo's shape (``common.digits_loss``, mode ``"jit"``), trained for a fixed number of
steps by ``meshfeed.fit`` with the loader's ``prefetch`` at 0, 1, 2 and 4, on two
sources:

- ``memory``: the digits in memory (reading a batch takes microseconds);
- ``remote``: the same digits behind 2 ms of latency per read, as a batch fetched from
  an object store or a network file system would be.

Each line has ``input_wait_share`` (devices idle while the loop waited for the next
batch: time in ``next(loader)`` after the previous step had finished),
``loader_share`` (all time in ``next(loader)``, most of it overlapping the step before)
and samples/s. The ``remote`` rows are how the default ``prefetch=2`` was chosen.

Goal: input wait <= 5% of step time at the default. Prints one JSON line per
measurement; ``--smoke`` for CI.
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
from collections.abc import Mapping

import jax
import numpy as np
import optax

import meshfeed
from common import DIGITS_BATCH_SIZE as GLOBAL_BATCH_SIZE
from common import DIGITS_LEARNING_RATE, digits, digits_loss, digits_params

LATENCY_S = 0.002


class Remote:
    """An in-memory source that takes ``LATENCY_S`` per read, like a remote store."""

    def __init__(self, source: meshfeed.ArraySource) -> None:
        self.source = source

    @property
    def fields(self) -> Mapping[str, meshfeed.FieldSpec]:
        return self.source.fields

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        time.sleep(LATENCY_S)
        return self.source[ids]


def run(source: str, prefetch: int, steps: int) -> dict[str, float]:
    train = digits()
    mesh = meshfeed.make_mesh(data=8)
    data = meshfeed.ArraySource(train)
    loader = meshfeed.Loader(
        Remote(data) if source == "remote" else data,
        global_batch_size=GLOBAL_BATCH_SIZE,
        sharding=meshfeed.batch_sharding(mesh),
        num_epochs=None,
        prefetch=prefetch,
    )
    optimizer = optax.adam(DIGITS_LEARNING_RATE)
    state = meshfeed.TrainState.create(digits_params(), optimizer, mesh=mesh)
    step = meshfeed.make_train_step(digits_loss, optimizer, mesh=mesh)
    state, _ = step(state, loader.batch(0))  # compile outside the timed loop
    jax.block_until_ready(state)
    history = meshfeed.fit(step, state, loader, num_steps=steps, log_every=50, progress=False)
    return {
        "input_wait_share": history.input_wait_share,
        "loader_share": history.loader_share,
        "samples_per_s": history.samples_per_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny run for CI")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    steps, rounds = (20, 1) if args.smoke else (args.steps, args.rounds)
    results: dict[tuple[str, int], list[dict[str, float]]] = {
        (source, p): [] for source in ("memory", "remote") for p in (0, 1, 2, 4)
    }
    for _ in range(rounds):
        for source, prefetch in results:
            results[source, prefetch].append(run(source, prefetch, steps))
    for (source, prefetch), runs in results.items():
        print(
            json.dumps(
                {
                    "benchmark": "input_wait",
                    "workload": "E" if source == "memory" else "E remote",
                    "name": f"fit:{source}:prefetch={prefetch}",
                    "source": source,
                    "prefetch": prefetch,
                    "default": prefetch == 2,
                    "input_wait_share": round(
                        statistics.median(r["input_wait_share"] for r in runs), 4
                    ),
                    "loader_share": round(statistics.median(r["loader_share"] for r in runs), 4),
                    "samples_per_s": round(statistics.median(r["samples_per_s"] for r in runs)),
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
