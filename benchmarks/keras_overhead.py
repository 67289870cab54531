"""Keras overhead: ``meshfeed.keras``'s step under ``meshfeed.fit`` vs the Keras multi-device
guide's bare jitted ``stateless_call`` step on placed batches (its convnet, batch 128, 8 CPU
devices). Goal: <= 1.15x the bare step."""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")  # read when keras is imported

import functools
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
CONVS = ((12, 3, 1, "same", False), (24, 6, 2, "valid", False), (32, 6, 2, "same", True))


def convnet() -> keras.Model:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((28, 28, 1))
    x = keras.layers.Rescaling(1.0 / 255.0)(inputs)
    for filters, size, strides, padding, bias in CONVS:
        x = keras.layers.Conv2D(filters, size, strides, padding, use_bias=bias)(x)
        x = keras.layers.BatchNormalization(scale=False)(x)
        x = keras.layers.ReLU()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dense(256, activation="relu")(x)
    x = keras.layers.Dropout(0.5)(x)
    return keras.Model(inputs, keras.layers.Dense(10)(x))


def run(mesh: Any, n: int, steps: int, bare: bool) -> float:
    """Seconds a step, compilation excluded: the guide's loop, or ``fit`` on the loader."""
    model = convnet()
    optimizer = keras.optimizers.Adam(1e-3)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    sharding = meshfeed.batch_sharding(mesh)
    source = meshfeed.ArraySource(images(n, side=28, channels=1))
    loader = meshfeed.Loader(source, global_batch_size=BATCH, sharding=sharding, num_epochs=None)
    quarter = max(1, steps // 4)
    if not bare:
        state = meshfeed.keras.create_state(model, optimizer, mesh=mesh)
        step = meshfeed.keras.make_train_step(
            model, loss_fn, optimizer, mesh=mesh, x="image", y="label", metrics=["accuracy"]
        )
        state = meshfeed.fit(step, state, loader, num_steps=1, progress=False).state  # compiles
        start = time.perf_counter()
        meshfeed.fit(step, state, loader, num_steps=steps, log_every=quarter, progress=False)
        return (time.perf_counter() - start) / steps
    optimizer.build(model.trainable_variables)
    replicated = NamedSharding(mesh, P())  # the guide's state: every variable on every device
    variables = (model.trainable_variables, model.non_trainable_variables, optimizer.variables)
    state = tuple(jax.device_put([np.asarray(v) for v in vs], replicated) for vs in variables)

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

    batches = [loader.batch(k) for k in range(8)]
    loss, state = train_step(state, batches[0]["image"], batches[0]["label"])
    jax.block_until_ready(state)
    start = time.perf_counter()
    for k in range(1, steps + 1):
        batch = batches[k % len(batches)]
        loss, state = train_step(state, batch["image"], batch["label"])
        if k % quarter == 0:
            float(loss)
    jax.block_until_ready(state)
    return (time.perf_counter() - start) / steps


def main() -> None:
    use_cpu_devices()
    args = arguments(__doc__, rounds=3)
    n = 1024 if args.smoke else 20_000
    steps = 4 if args.smoke else 60
    mesh = meshfeed.make_mesh(data=8)
    names = {"bare_stateless_step": True, "keras_fit": False}
    entries = {k: functools.partial(run, mesh, n, steps, bare) for k, bare in names.items()}
    per_round = in_rounds(entries, args.rounds)
    common = {"global_batch_size": BATCH, "steps": steps, "rounds": args.rounds}
    common["keras"] = keras.__version__
    for name in names:
        seconds = median_of(per_round, name) or 0.0
        line = {"seconds_per_step": seconds, "samples_per_s": round(BATCH / seconds)}
        if name == "keras_fit":  # the median of the rounds' ratios
            line["ratio_to_bare"] = median_ratio(per_round, name, "bare_stateless_step")
        emit("keras_overhead", smoke=args.smoke, name=name, **common, **line)


if __name__ == "__main__":
    main()
