"""Keras models and runs for the Keras tests; importable by run_in_processes' processes."""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax
import keras
import numpy as np

import meshfeed
import meshfeed.keras

STEPS = 10
GLOBAL_BATCH_SIZE = 32


def data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 12)).astype(np.float32)
    y = (x[:, :3].sum(1) > 0).astype(np.int32) + (x[:, 3] > 0.5).astype(np.int32)
    return {"x": x, "y": y}


def model(dropout: float = 0.0, *, norm: bool = True) -> keras.Model:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((12,))
    h = keras.layers.Dense(32, use_bias=not norm, name="hidden")(inputs)
    if norm:
        h = keras.layers.BatchNormalization(name="norm")(h)
    h = keras.layers.ReLU()(h)
    if dropout:
        h = keras.layers.Dropout(dropout)(h)
    return keras.Model(inputs, keras.layers.Dense(3, name="out")(h))


def optimizer() -> keras.optimizers.Optimizer:
    return keras.optimizers.Adam(1e-2)


LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def fit(mesh: Any, net: keras.Model, loader: Any, **kw: Any) -> Any:
    """``meshfeed.keras.fit`` with these tests' optimizer, loss and metric."""
    return meshfeed.keras.fit(
        net, loader, optimizer=optimizer(), loss=LOSS, metrics=["accuracy"], mesh=mesh, **kw
    )


def loader(mesh: Any) -> meshfeed.Loader:
    return meshfeed.Loader(
        meshfeed.ArraySource(data()),
        global_batch_size=GLOBAL_BATCH_SIZE,
        sharding=meshfeed.batch_sharding(mesh),
        num_epochs=None,
        seed=1,
    )


def weights(net: keras.Model) -> dict[str, np.ndarray]:
    return {v.path: np.asarray(v.value) for v in net.weights}


def train(
    mesh: Any,
    *,
    dropout: float = 0.0,
    norm: bool = True,
    layout_map: Any = None,
    mode: Any = "jit",
    seed: int = 0,
    batches: Any = None,
) -> dict[str, Any]:
    """``STEPS`` steps of the functions with ``meshfeed.fit``, then ``update_model``."""
    net, adam = model(dropout, norm=norm), optimizer()
    state = meshfeed.keras.create_state(net, adam, mesh=mesh, layout_map=layout_map, seed=seed)
    step = meshfeed.keras.make_train_step(net, LOSS, adam, mesh=mesh, mode=mode)
    batches = loader(mesh) if batches is None else batches
    run = meshfeed.fit(step, state, batches, num_steps=STEPS, log_every=1, progress=False)
    meshfeed.keras.update_model(net, run.state)
    return {
        "weights": weights(net),
        "losses": [logged["loss"] for logged in run.train],
        "kernel_spec": tuple(run.state.params[0].sharding.spec),
        "moment_specs": [tuple(v.sharding.spec) for v in run.state.opt_state],
        "seeds": seed_states(net),
    }


def seed_states(net: keras.Model) -> list[np.ndarray]:
    return [np.asarray(v.value) for v in net.non_trainable_variables if "seed_generator" in v.path]


def train_data_parallel() -> dict[str, Any]:
    return train(meshfeed.make_mesh(data=jax.device_count()))


def train_single_device() -> dict[str, Any]:
    return train(meshfeed.make_mesh(data=1, devices=jax.devices()[:1]))


def model_parallel_layout(mesh: Any) -> keras.distribution.LayoutMap:
    devices = keras.distribution.DeviceMesh(
        shape=tuple(mesh.shape.values()),
        axis_names=list(mesh.axis_names),
        devices=list(mesh.devices.flat),
    )
    layout_map = keras.distribution.LayoutMap(devices)
    layout_map["hidden/kernel"] = (None, "model")
    layout_map["out/kernel"] = ("model", None)
    return layout_map


def train_model_parallel() -> dict[str, Any]:
    mesh = meshfeed.make_mesh(data=4, model=2)
    return train(mesh, layout_map=model_parallel_layout(mesh))


def padded_batches(mesh: Any, rows: int, global_batch_size: int) -> list[dict[str, Any]]:
    """Every batch of the first ``rows`` examples, the last padded to its full size."""
    few = {k: v[:rows] for k, v in data().items()}
    loader = meshfeed.Loader(
        meshfeed.ArraySource(few),
        global_batch_size=global_batch_size,
        sharding=meshfeed.batch_sharding(mesh),
        shuffle=False,
        last_batch="pad",
    )
    return list(loader)
