"""What the benchmarks share: timing, the hand-off to global arrays, the digits workload.

Benchmarks use meshfeed's public API only; anything two of them need lives here.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import numpy as np
import optax

import meshfeed

DIGITS_BATCH_SIZE = 64
DIGITS_LEARNING_RATE = 3e-3


def measure(
    run: Callable[[], Iterator[Any]],
    batch: int,
    seconds: float,
    warmup: int = 3,
    *,
    steps: int | None = None,
) -> float:
    """Samples per second over ``seconds`` of steady-state iteration of ``run()``.

    With ``steps``, over exactly that many steps instead: what several processes must
    use when each step runs a collective, or they would stop after different counts and
    leave one waiting for the others.
    """
    it = run()
    for _ in range(warmup):
        jax.block_until_ready(next(it))
    done, start = 0, time.perf_counter()
    while True:
        jax.block_until_ready(next(it))
        done += 1
        elapsed = time.perf_counter() - start
        if (steps is None and elapsed >= seconds) or (steps is not None and done >= steps):
            return done * batch / elapsed


def loops_at_once(script: str, count: int) -> float:
    """The sum of what ``count`` processes running ``script`` at once print: each prints
    ``ready`` when set up, waits for a line on stdin (so all start together), runs, and
    prints its rate."""
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for _ in range(count)
    ]
    for run in runs:
        assert run.stdout is not None and run.stdout.readline().strip() == "ready"
    for run in runs:
        assert run.stdin is not None
        run.stdin.write("go\n")
        run.stdin.flush()
    return sum(float(run.communicate()[0]) for run in runs)


def to_global(batches: Iterator[dict[str, np.ndarray]], global_batch_size: int) -> Iterator[Any]:
    """A peer loader's host batches (this process's rows) as global ``jax.Array``s,
    split over every device with ``make_array_from_process_local_data`` -- how every
    benchmark entry ends, so that peers and meshfeed deliver the same thing."""
    sharding = meshfeed.batch_sharding(meshfeed.make_mesh(data=jax.device_count()))
    for batch in batches:
        yield {
            k: jax.make_array_from_process_local_data(
                sharding, v, (global_batch_size, *v.shape[1:])
            )
            for k, v in batch.items()
        }


def digits() -> dict[str, np.ndarray]:
    """scikit-learn's 1797 8x8 handwritten digits, images in [0, 1], NHWC."""
    from sklearn.datasets import load_digits

    data: Any = load_digits()
    images = (np.asarray(data.images) / 16.0).astype(np.float32)[..., None]
    return {"image": images, "label": np.asarray(data.target).astype(np.int32)}


def digits_params(seed: int = 0) -> dict[str, np.ndarray]:
    """A small convnet for the digits (the demo's shape): two 3x3 convs, then dense."""
    rng = np.random.default_rng(seed)
    shapes = {"conv1": (3, 3, 1, 16), "conv2": (3, 3, 16, 32), "dense": (4 * 4 * 32, 10)}
    params = {
        name: (rng.normal(size=s) * np.sqrt(2.0 / np.prod(s[:-1]))).astype(np.float32)
        for name, s in shapes.items()
    }
    return {**params, **{f"{n}_bias": np.zeros(s[-1], np.float32) for n, s in shapes.items()}}


def digits_loss(params: Any, batch: Any) -> tuple[Any, dict[str, Any]]:
    """Cross-entropy of the convnet on ``batch`` (mean over its valid rows)."""
    dims = ("NHWC", "HWIO", "NHWC")
    x = batch["image"]
    for name, stride in (("conv1", 1), ("conv2", 2)):
        x = jax.lax.conv_general_dilated(
            x, params[name], (stride,) * 2, "SAME", dimension_numbers=dims
        )
        x = jax.nn.relu(x + params[f"{name}_bias"])
    logits = x.reshape(x.shape[0], -1) @ params["dense"] + params["dense_bias"]
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"])
    return meshfeed.masked_mean(loss, batch), {}


def fit_digits(loader: meshfeed.Loader, steps: int) -> meshfeed.train.History:
    """The demo's convnet trained by ``fit`` for ``steps`` steps of ``loader`` (the digits
    at ``DIGITS_BATCH_SIZE``), compiled before the timed loop."""
    mesh = next(iter(loader.batch(0).values())).sharding.mesh  # type: ignore[attr-defined]
    optimizer = optax.adam(DIGITS_LEARNING_RATE)
    state = meshfeed.TrainState.create(digits_params(), optimizer, mesh=mesh)
    step = meshfeed.make_train_step(digits_loss, optimizer, mesh=mesh)
    state, _ = step(state, loader.batch(0))  # compile outside the timed loop
    jax.block_until_ready(state)
    return meshfeed.fit(step, state, loader, num_steps=steps, log_every=50, progress=False)


class Remote:
    """An in-memory source that takes ``latency_s`` per read, like a remote store."""

    def __init__(self, source: meshfeed.ArraySource, latency_s: float) -> None:
        self.source, self.latency_s = source, latency_s

    @property
    def fields(self) -> Mapping[str, meshfeed.sources.FieldSpec]:
        return self.source.fields

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        time.sleep(self.latency_s)
        return self.source[ids]
