"""Keras overhead: ``meshfeed.keras``'s step under ``meshfeed.fit`` vs the guide's bare step.

One process, 8 CPU devices, data parallel. The model is the Keras multi-device guide's
convnet (conv + batch norm + dropout) on MNIST-shaped uint8 images, global batch 128.
The baseline is the guide's ``train_step`` (``model.stateless_call``,
``optimizer.stateless_apply``, ``jax.value_and_grad``) under ``jax.jit``, looping over
batches placed on the devices before timing; ``meshfeed.keras.make_train_step`` (its
``TrainState`` from ``meshfeed.keras.create_state``) runs under ``meshfeed.fit``, fed by
a ``meshfeed.Loader``, and also computes the accuracy each step. Both sync
once per ``--steps``-step run's quarter. Rounds are interleaved; medians are reported.

Goal: ``fit`` time per step <= 1.15x the bare step. Prints one JSON line per
measurement; ``--smoke`` for CI.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("KERAS_BACKEND", "jax")

import argparse
import json
import platform
import statistics
import time
from typing import Any

import jax
import keras
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshfeed
import meshfeed.keras

BATCH = 128


def convnet() -> keras.Model:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((28, 28, 1))
    x = keras.layers.Rescaling(1.0 / 255.0)(inputs)
    x = keras.layers.Conv2D(12, 3, padding="same", use_bias=False)(x)
    x = keras.layers.BatchNormalization(scale=False)(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.Conv2D(24, 6, strides=2, use_bias=False)(x)
    x = keras.layers.BatchNormalization(scale=False)(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.Conv2D(32, 6, padding="same", strides=2)(x)
    x = keras.layers.BatchNormalization(scale=False)(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dense(256, activation="relu")(x)
    x = keras.layers.Dropout(0.5)(x)
    return keras.Model(inputs, keras.layers.Dense(10)(x))


def make_loader(mesh: Any, n: int) -> meshfeed.Loader:
    rng = np.random.default_rng(0)
    data = {
        "image": rng.integers(0, 256, (n, 28, 28, 1), dtype=np.uint8),
        "label": rng.integers(0, 10, n, dtype=np.int32),
    }
    return meshfeed.Loader(
        meshfeed.ArraySource(data),
        global_batch_size=BATCH,
        sharding=meshfeed.batch_sharding(mesh),
        num_epochs=None,
    )


def bare(mesh: Any, n: int, steps: int) -> float:
    """The guide's loop: seconds per step on pre-placed batches."""
    model = convnet()
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    replicated = NamedSharding(mesh, P())

    def put(variables: Any) -> list[jax.Array]:
        values = [np.asarray(v) for v in variables]
        return [
            jax.make_array_from_callback(v.shape, replicated, lambda i, v=v: v[i]) for v in values
        ]

    state = (
        put(model.trainable_variables),
        put(model.non_trainable_variables),
        put(optimizer.variables),
    )

    def compute_loss(trainable: Any, non_trainable: Any, x: Any, y: Any) -> Any:
        y_pred, non_trainable = model.stateless_call(trainable, non_trainable, x, training=True)
        return loss_fn(y, y_pred), non_trainable

    @jax.jit
    def train_step(state: Any, x: Any, y: Any) -> Any:
        trainable, non_trainable, optimizer_vars = state
        (loss, non_trainable), grads = jax.value_and_grad(compute_loss, has_aux=True)(
            trainable, non_trainable, x, y
        )
        trainable, optimizer_vars = optimizer.stateless_apply(optimizer_vars, grads, trainable)
        return loss, (trainable, non_trainable, optimizer_vars)

    loader = make_loader(mesh, n)
    batches = [loader.batch(k) for k in range(8)]
    loss, state = train_step(state, batches[0]["image"], batches[0]["label"])
    jax.block_until_ready(state)
    start = time.perf_counter()
    for k in range(1, steps + 1):
        batch = batches[k % len(batches)]
        loss, state = train_step(state, batch["image"], batch["label"])
        if k % max(1, steps // 4) == 0:
            float(loss)
    jax.block_until_ready(state)
    return (time.perf_counter() - start) / steps


def keras_fit(mesh: Any, n: int, steps: int) -> float:
    """``meshfeed.keras``'s step under ``meshfeed.fit``, fed by the loader: seconds per
    step, compilation excluded."""
    model, optimizer = convnet(), keras.optimizers.Adam(1e-3)
    state = meshfeed.keras.create_state(model, optimizer, mesh=mesh)
    step = meshfeed.keras.make_train_step(
        model,
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer,
        mesh=mesh,
        x="image",
        y="label",
        metrics=["accuracy"],
    )
    loader = make_loader(mesh, n)
    quarter = max(1, steps // 4)
    state = meshfeed.fit(step, state, loader, num_steps=1, progress=False).state  # compiles
    start = time.perf_counter()
    meshfeed.fit(step, state, loader, num_steps=steps, log_every=quarter, progress=False)
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny run for CI")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    steps, rounds, n = (4, 1, 1024) if args.smoke else (args.steps, args.rounds, 20_000)
    mesh = meshfeed.make_mesh(data=8)
    bare_runs, fit_runs = [], []
    for _ in range(rounds):
        bare_runs.append(bare(mesh, n, steps))
        fit_runs.append(keras_fit(mesh, n, steps))
    base, fit_step = statistics.median(bare_runs), statistics.median(fit_runs)
    common = {
        "benchmark": "keras_overhead",
        "global_batch_size": BATCH,
        "steps": steps,
        "rounds": rounds,
        "devices": jax.device_count(),
        "processes": jax.process_count(),
        "smoke": args.smoke,
        "jax": jax.__version__,
        "keras": keras.__version__,
        "python": platform.python_version(),
    }
    print(
        json.dumps(
            {
                **common,
                "name": "bare_stateless_step",
                "seconds_per_step": base,
                "samples_per_s": round(BATCH / base),
            }
        )
    )
    print(
        json.dumps(
            {
                **common,
                "name": "keras_fit",
                "seconds_per_step": fit_step,
                "samples_per_s": round(BATCH / fit_step),
                "ratio_to_bare": round(
                    statistics.median(f / b for f, b in zip(fit_runs, bare_runs, strict=True)), 3
                ),  # the median of the rounds' ratios
            }
        )
    )


if __name__ == "__main__":
    main()
