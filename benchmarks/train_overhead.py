"""Training overhead: ``fit`` fed by the loader vs the same jitted step on batches already
on device (an MLP on MNIST-shaped images, batch 256, 8 CPU devices). Goal: <= 1.10x."""

from __future__ import annotations

import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from harness import arguments, emit, in_rounds, median_of, median_ratio, use_cpu_devices
from workload_fns import images

import meshfeed

LOG_EVERY = 20
BATCH = 256
HIDDEN = 512


def loss_fn(params: Any, batch: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
    x = batch["image"].reshape(batch["image"].shape[0], -1).astype(jnp.float32) / 255.0
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    loss = optax.softmax_cross_entropy_with_integer_labels(h @ params["w2"], batch["label"])
    return meshfeed.masked_mean(loss, batch), {}


def run(data: dict[str, np.ndarray], steps: int, on_device: bool) -> dict:
    """The same step and state, fed by ``fit`` and the loader or by 16 placed batches."""
    rng = np.random.default_rng(0)
    params = {
        "w1": (rng.normal(size=(784, HIDDEN)) * 0.05).astype(np.float32),
        "b1": np.zeros(HIDDEN, np.float32),
        "w2": (rng.normal(size=(HIDDEN, 10)) * 0.05).astype(np.float32),
    }
    mesh = meshfeed.make_mesh(data=8)
    optimizer = optax.sgd(0.1)
    state = meshfeed.TrainState.create(params, optimizer, mesh=mesh)
    step = meshfeed.make_train_step(loss_fn, optimizer, mesh=mesh)
    sharding = meshfeed.batch_sharding(mesh)
    source = meshfeed.ArraySource(data)
    loader = meshfeed.Loader(source, global_batch_size=BATCH, sharding=sharding, num_epochs=None)
    ready = [loader.batch(k) for k in range(16 if on_device else 1)]
    state, _ = step(state, ready[0])  # compile outside the timed region
    jax.block_until_ready((state, ready))
    if not on_device:
        history = meshfeed.fit(
            step, state, loader, num_steps=steps, log_every=LOG_EVERY, progress=False
        )
        seconds = history.seconds / history.steps
        return {"seconds_per_step": seconds, "input_wait_share": history.input_wait_share}
    start = time.perf_counter()
    for k in range(1, steps + 1):
        state, metrics = step(state, ready[k % len(ready)])
        if k % LOG_EVERY == 0 or k == steps:
            float(metrics["loss"])
    jax.block_until_ready(state)
    return {"seconds_per_step": (time.perf_counter() - start) / steps}


def main() -> None:
    use_cpu_devices()
    args = arguments(__doc__, rounds=3)
    steps = 10 if args.smoke else 200
    data = images(2048 if args.smoke else 60_000, side=28, channels=1)
    names = {"on_device_batches": True, "fit_with_loader": False}
    entries = {n: functools.partial(run, data, steps, on) for n, on in names.items()}
    per_round = in_rounds(entries, args.rounds)
    common = {"global_batch_size": BATCH, "steps": steps, "rounds": args.rounds, "hidden": HIDDEN}
    for name in names:
        seconds = median_of(per_round, name, "seconds_per_step") or 0.0
        line = {"seconds_per_step": seconds, "samples_per_s": round(BATCH / seconds)}
        if name == "fit_with_loader":
            ratio = median_ratio(per_round, name, "on_device_batches", "seconds_per_step")
            line["ratio_to_on_device"] = ratio  # the median of the rounds' ratios
            line["input_wait_share"] = round(median_of(per_round, name, "input_wait_share") or 0, 4)
        emit("train_overhead", smoke=args.smoke, name=name, **common, **line)


if __name__ == "__main__":
    main()
