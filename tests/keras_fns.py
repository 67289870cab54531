"""Keras models and runs for the Keras tests; importable by run_in_processes' processes."""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax
import keras
import numpy as np

import meshfeed
from meshfeed.keras import KerasTrainer

STEPS = 10
GLOBAL_BATCH_SIZE = 32


def data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 12)).astype(np.float32)
    y = (x[:, :3].sum(1) > 0).astype(np.int32) + (x[:, 3] > 0.5).astype(np.int32)
    return {"x": x, "y": y}


def model(dropout: float = 0.0) -> keras.Model:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((12,))
    h = keras.layers.Dense(32, use_bias=False, name="hidden")(inputs)  # BN follows
    h = keras.layers.BatchNormalization(name="norm")(h)
    h = keras.layers.ReLU()(h)
    if dropout:
        h = keras.layers.Dropout(dropout)(h)
    return keras.Model(inputs, keras.layers.Dense(3, name="out")(h))


def trainer(mesh: Any, net: keras.Model, layout_map: Any = None) -> KerasTrainer:
    return KerasTrainer(
        net,
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        mesh=mesh,
        layout_map=layout_map,
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


def train(mesh: Any, *, dropout: float = 0.0, layout_map: Any = None) -> dict[str, Any]:
    net = model(dropout)
    t = trainer(mesh, net, layout_map)
    history = t.fit(loader(mesh), epochs=1, steps_per_epoch=STEPS, progress=False)
    return {
        "weights": weights(net),
        "history": history.history,
        "kernel_spec": tuple(t.state[0][0].sharding.spec),
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
