"""``meshfeed bench loader``: quick loader measurements on the user's own shapes and mesh.

Times every strategy on synthetic data of a given shape against the floor -- a numpy
gather of the same number of shuffled rows plus ``make_array_from_process_local_data``
-- in one run, so the ratios are comparable even on a noisy machine. The full suite
against Grain and PyTorch lives in the repository's ``benchmarks/``.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

from meshfeed import ArraySource, Loader, batch_sharding, make_mesh, reshard
from meshfeed.inspect import STRATEGIES
from meshfeed.types import Strategy


def _samples_per_s(run: Callable[[], Iterator[Any]], batch: int, seconds: float) -> float:
    """Samples per second over ``seconds`` of steady-state iteration of ``run()``."""
    it = run()
    for _ in range(3):  # warm up: compile, start threads
        jax.block_until_ready(next(it))
    done = 0
    start = time.perf_counter()
    while True:
        jax.block_until_ready(next(it))
        done += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return done * batch / elapsed


def bench_loader(
    *,
    shape: Sequence[int] = (28, 28, 1),
    dtype: Any = np.uint8,
    examples: int = 20_000,
    global_batch_size: int = 256,
    mesh: dict[str, int] | None = None,
    seconds: float = 1.0,
) -> list[dict[str, Any]]:
    """Samples/s of every strategy and of the floor, for one field of ``shape``.

    Args:
      shape: per-example shape.
      dtype: element type.
      examples: rows of synthetic data (random bytes).
      global_batch_size: rows per step.
      mesh: mesh axes, default ``{"data": jax.device_count()}``; the batch is split
        over the first axis.
      seconds: timing per entry.

    Returns:
      One dict per entry: ``name``, ``samples_per_s``, ``ratio_to_floor``.
    """
    axes = mesh or {"data": jax.device_count()}
    the_mesh = make_mesh(**axes)  # type: ignore[arg-type]
    sharding = batch_sharding(the_mesh, next(iter(axes)))
    rng = np.random.default_rng(0)
    nbytes = examples * math.prod(shape) * np.dtype(dtype).itemsize
    data = {"x": rng.integers(0, 256, nbytes, dtype=np.uint8).view(dtype).reshape(examples, *shape)}

    def floor() -> Iterator[Any]:
        order = rng.permutation(examples)
        steps = examples // global_batch_size
        for k in range(10**12):
            rows = order[(k % steps) * global_batch_size : (k % steps + 1) * global_batch_size]
            x = data["x"][rows]
            yield jax.make_array_from_process_local_data(sharding, x, x.shape)

    def loader(strategy: Strategy) -> Callable[[], Iterator[Any]]:
        def run() -> Iterator[Any]:
            source = ArraySource(data)
            it = Loader(
                source,
                global_batch_size=global_batch_size,
                sharding=sharding,
                strategy=strategy,
                num_epochs=None,
            )  # type: ignore[arg-type]
            move = jax.jit(lambda b: reshard(b, sharding))
            for batch in it:
                yield move(batch) if strategy == "reshard" else batch

        return run

    rates = {"floor": _samples_per_s(floor, global_batch_size, seconds)}
    for strategy in STRATEGIES:
        rates[strategy] = _samples_per_s(loader(strategy), global_batch_size, seconds)
    return [
        {
            "name": name,
            "samples_per_s": round(rate),
            "ratio_to_floor": round(rate / rates["floor"], 3),
        }
        for name, rate in rates.items()
    ]


def report_loader(**kwargs: Any) -> int:
    """Runs ``bench_loader(**kwargs)``, saying first what it times, and prints one JSON
    line per entry."""
    seconds = kwargs.get("seconds", 1.0)
    print(
        f"timing the floor and {len(STRATEGIES)} strategies, {seconds:g} s each after a "
        "warm-up (compilation included): about "
        f"{round((1 + len(STRATEGIES)) * (seconds + 1))} s.",
        file=sys.stderr,
        flush=True,
    )
    for line in bench_loader(**kwargs):
        print(json.dumps(line))
    return 0
