"""Training overhead: ``fit`` fed by the loader vs the same step on batches already on device.

An MLP on MNIST-shaped uint8 images, global batch 256, 8 CPU devices; both runs use the same
jitted step and sync the same way. Goal: ``fit`` <= 1.10x the baseline per step, input wait
<= 5%. ``--smoke`` for CI; the workload is in ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from harness import arguments, emit, in_rounds, median_of, use_cpu_devices
from workload_fns import images

import meshfeed

LOG_EVERY = 20
BATCH = 256


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


def _setup(data: dict[str, np.ndarray], hidden: int) -> tuple[Any, Any, Any]:
    """The same step, state and loader for both runs."""
    mesh = meshfeed.make_mesh(data=8)
    optimizer = optax.sgd(0.1)
    state = meshfeed.TrainState.create(init_params(hidden), optimizer, mesh=mesh)
    step = meshfeed.make_train_step(loss_fn, optimizer, mesh=mesh)
    loader = meshfeed.Loader(
        meshfeed.ArraySource(data),
        global_batch_size=BATCH,
        sharding=meshfeed.batch_sharding(mesh),
        num_epochs=None,
    )
    return step, state, loader


def run_fit(data: dict[str, np.ndarray], steps: int, hidden: int) -> dict[str, float]:
    step, state, loader = _setup(data, hidden)
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


def run_on_device(data: dict[str, np.ndarray], steps: int, hidden: int) -> dict[str, float]:
    step, state, loader = _setup(data, hidden)
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
    return {"seconds_per_step": (time.perf_counter() - start) / steps}


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--hidden", type=int, default=512)


def main() -> None:
    use_cpu_devices()
    args = arguments(__doc__, rounds=3, smoke={"steps": 10, "rounds": 1}, add=_flags)
    data = images(2048 if args.smoke else 60_000, side=28, channels=1)
    per_round = in_rounds(
        {
            "on_device_batches": lambda: run_on_device(data, args.steps, args.hidden),
            "fit_with_loader": lambda: run_fit(data, args.steps, args.hidden),
        },
        args.rounds,
    )
    base = median_of(per_round, "on_device_batches", "seconds_per_step")
    fit_step = median_of(per_round, "fit_with_loader", "seconds_per_step")
    wait = median_of(per_round, "fit_with_loader", "input_wait_share")
    assert base is not None and fit_step is not None and wait is not None
    run = {"global_batch_size": BATCH, "steps": args.steps, "rounds": args.rounds}
    run |= {"hidden": args.hidden, "smoke": args.smoke}
    on_device = {"seconds_per_step": base, "samples_per_s": round(BATCH / base)}
    emit("train_overhead", name="on_device_batches", **run, **on_device)
    fit = {"seconds_per_step": fit_step, "samples_per_s": round(BATCH / fit_step)}
    fit |= {"ratio_to_on_device": round(fit_step / base, 3), "input_wait_share": round(wait, 4)}
    emit("train_overhead", name="fit_with_loader", **run, **fit)


if __name__ == "__main__":
    main()
