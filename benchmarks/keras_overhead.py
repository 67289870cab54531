"""Keras overhead: ``meshfeed.keras``'s step under ``meshfeed.fit`` vs the guide's bare step.

The Keras multi-device guide's convnet, global batch 128, 8 CPU devices; the peer is the
guide's jitted ``stateless_call`` step on batches placed before timing. Goal: ``fit`` <=
1.15x the bare step. ``--smoke`` for CI; the workload is in ``benchmarks/README.md``.
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")  # read when keras is imported

import argparse
import time
from typing import Any

import jax
import keras
import numpy as np
from harness import arguments, emit, in_rounds, median_of, median_ratio, use_cpu_devices
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from workload_fns import images

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
    return meshfeed.Loader(
        meshfeed.ArraySource(images(n, side=28, channels=1)),
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
    model = convnet()
    optimizer = keras.optimizers.Adam(1e-3)
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


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=60)


def main() -> None:
    use_cpu_devices()
    args = arguments(__doc__, rounds=3, smoke={"steps": 4, "rounds": 1}, add=_flags)
    n = 1024 if args.smoke else 20_000
    mesh = meshfeed.make_mesh(data=8)
    per_round = in_rounds(
        {
            "bare_stateless_step": lambda: bare(mesh, n, args.steps),
            "keras_fit": lambda: keras_fit(mesh, n, args.steps),
        },
        args.rounds,
    )
    base = median_of(per_round, "bare_stateless_step")
    fit_step = median_of(per_round, "keras_fit")
    assert base is not None and fit_step is not None
    run = {"global_batch_size": BATCH, "steps": args.steps, "rounds": args.rounds}
    run |= {"keras": keras.__version__, "smoke": args.smoke}
    bare_line = {"seconds_per_step": base, "samples_per_s": round(BATCH / base)}
    emit("keras_overhead", name="bare_stateless_step", **run, **bare_line)
    fit = {"seconds_per_step": fit_step, "samples_per_s": round(BATCH / fit_step)}
    ratio = median_ratio(per_round, "keras_fit", "bare_stateless_step")  # of the rounds' ratios
    emit("keras_overhead", name="keras_fit", **run, **fit, ratio_to_bare=ratio)


if __name__ == "__main__":
    main()
