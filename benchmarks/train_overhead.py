"""Training overhead: ``fit`` fed by the loader vs the same step on batches already on device.

One process, 8 CPU devices, data parallel (``P('data')``), an MLP (784 -> 512 -> 10) on
MNIST-shaped uint8 images, global batch 256, shuffled. Both runs use the same jitted step
(mode ``"jit"``) and the same number of steps, and both sync the same way (metrics every
``log_every`` steps). The baseline cycles through batches placed on the devices before
timing, so it pays nothing for input. Rounds are interleaved; the median is reported.

Goal: ``fit`` time per step <= 1.10x the baseline, and input-wait share <= 5%.
Prints one JSON line per measurement; ``--smoke`` for CI.
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
import jax.numpy as jnp
import numpy as np
import optax

import meshfeed

LOG_EVERY = 20


def make_data(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "image": rng.integers(0, 256, (n, 28, 28, 1), dtype=np.uint8),
        "label": rng.integers(0, 10, n, dtype=np.int32),
    }


def init_params(hidden: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "w1": (rng.normal(size=(784, hidden)) * 0.05).astype(np.float32),
        "b1": np.zeros(hidden, np.float32),
        "w2": (rng.normal(size=(hidden, 10)) * 0.05).astype(np.float32),
    }


def loss_fn(params: Any, batch: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
    x = batch["image"].reshape(batch["image"].shape[0], -1).astype(jnp.float32) / 255.0
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    loss = optax.softmax_cross_entropy_with_integer_labels(h @ params["w2"], batch["label"])
    return meshfeed.masked_mean(loss, batch), {}


def _setup(data: dict[str, np.ndarray], batch: int, hidden: int) -> tuple[Any, Any, Any]:
    """The same step, state and loader for both runs."""
    mesh = meshfeed.make_mesh(data=8)
    optimizer = optax.sgd(0.1)
    state = meshfeed.TrainState.create(init_params(hidden), optimizer, mesh=mesh)
    step = meshfeed.make_train_step(loss_fn, optimizer, mesh=mesh)
    loader = meshfeed.Loader(
        meshfeed.ArraySource(data),
        global_batch_size=batch,
        sharding=meshfeed.batch_sharding(mesh),
        num_epochs=None,
    )
    return step, state, loader


def run_fit(data: dict[str, np.ndarray], batch: int, steps: int, hidden: int) -> dict[str, float]:
    step, state, loader = _setup(data, batch, hidden)
    # Compile outside the timed region, as the baseline does.
    state, _ = step(state, loader.batch(0))
    jax.block_until_ready(state)
    history = meshfeed.fit(
        step, state, loader, num_steps=steps, log_every=LOG_EVERY, progress=False
    )
    return {
        "seconds_per_step": history.seconds / history.steps,
        "input_wait_share": history.input_wait_share,
    }


def run_on_device(data: dict[str, np.ndarray], batch: int, steps: int, hidden: int) -> float:
    step, state, loader = _setup(data, batch, hidden)
    ready = [loader.batch(k) for k in range(16)]
    jax.block_until_ready(ready)
    state, _ = step(state, ready[0])
    jax.block_until_ready(state)
    start = time.perf_counter()
    for k in range(1, steps + 1):
        state, metrics = step(state, ready[k % len(ready)])
        if k % LOG_EVERY == 0 or k == steps:
            float(metrics["loss"])
    jax.block_until_ready(state)
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny run for CI")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=512)
    args = parser.parse_args()
    steps, rounds, n = (10, 1, 2048) if args.smoke else (args.steps, args.rounds, 60_000)
    batch = 256
    data = make_data(n)
    fit_runs, base_runs = [], []
    for _ in range(rounds):
        base_runs.append(run_on_device(data, batch, steps, args.hidden))
        fit_runs.append(run_fit(data, batch, steps, args.hidden))
    base = statistics.median(base_runs)
    fit_step = statistics.median(r["seconds_per_step"] for r in fit_runs)
    wait = statistics.median(r["input_wait_share"] for r in fit_runs)
    common = {
        "benchmark": "train_overhead",
        "global_batch_size": batch,
        "steps": steps,
        "rounds": rounds,
        "hidden": args.hidden,
        "devices": jax.device_count(),
        "processes": jax.process_count(),
        "smoke": args.smoke,
        "jax": jax.__version__,
        "python": platform.python_version(),
    }
    print(
        json.dumps(
            {
                **common,
                "name": "on_device_batches",
                "seconds_per_step": base,
                "samples_per_s": round(batch / base),
            }
        )
    )
    print(
        json.dumps(
            {
                **common,
                "name": "fit_with_loader",
                "seconds_per_step": fit_step,
                "samples_per_s": round(batch / fit_step),
                "ratio_to_on_device": round(fit_step / base, 3),
                "input_wait_share": round(wait, 4),
            }
        )
    )


if __name__ == "__main__":
    main()
