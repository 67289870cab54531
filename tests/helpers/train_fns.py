"""A small classifier, its data and a single-device reference, for the training tests.

Importable by the processes ``run_in_processes`` starts.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshfeed

NUM_EXAMPLES = 100
GLOBAL_BATCH_SIZE = 16
HIDDEN = 16
STEPS = 20
OPTIMIZER = optax.adam(1e-2)


def source() -> meshfeed.ArraySource:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(NUM_EXAMPLES, 6)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int32) + (x[:, 2] > 1).astype(np.int32)
    return meshfeed.ArraySource({"x": x, "y": y})


def init_params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {
        "w1": (rng.normal(size=(6, HIDDEN)) * 0.4).astype(np.float32),
        "b1": np.zeros(HIDDEN, np.float32),
        "w2": (rng.normal(size=(HIDDEN, 3)) * 0.4).astype(np.float32),
    }


def per_row_loss(params: Any, batch: Any) -> tuple[jax.Array, jax.Array]:
    h = jnp.tanh(batch["x"] @ params["w1"] + params["b1"])
    logits = h @ params["w2"]
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"])
    return loss, (jnp.argmax(logits, -1) == batch["y"]).astype(jnp.float32)


def loss_fn(params: Any, batch: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
    loss, correct = per_row_loss(params, batch)
    return meshfeed.masked_mean(loss, batch), {"accuracy": meshfeed.masked_mean(correct, batch)}


def eval_fn(params: Any, batch: Any) -> dict[str, jax.Array]:
    return loss_fn(params, batch)[1]


def loader(mesh: Any, axes: tuple[str, ...] = ("data",)) -> meshfeed.Loader:
    return meshfeed.Loader(
        source(),
        global_batch_size=GLOBAL_BATCH_SIZE,
        sharding=meshfeed.batch_sharding(mesh, axes),
        last_batch="pad",  # 100 rows, batch 16: step 7 of each epoch is padded
        num_epochs=None,
        seed=4,
    )


def reference_params(steps: int = STEPS) -> dict[str, np.ndarray]:
    """Single-device training on the same global batches."""
    one = meshfeed.make_mesh(data=1, devices=jax.devices()[:1])
    state = meshfeed.TrainState.create(init_params(), OPTIMIZER, mesh=one)
    step = meshfeed.make_train_step(loss_fn, OPTIMIZER, mesh=one, mode="jit")
    schedule = loader(meshfeed.make_mesh(data=jax.device_count()))
    here = NamedSharding(one, P())
    for k in range(steps):
        ids = schedule.ids(k)
        rows = source()[np.maximum(ids, 0)]
        batch = {**rows, "mask": ids >= 0}
        state, _ = step(state, {n: jax.device_put(v, here) for n, v in batch.items()})
    return {n: np.asarray(v) for n, v in state.params.items()}


def fit_losses(steps: int = STEPS) -> list[float]:
    """Each step's loss of an unbroken ``fit`` on a data-parallel mesh of every device."""
    mesh = meshfeed.make_mesh(data=jax.device_count())
    state = meshfeed.TrainState.create(init_params(), OPTIMIZER, mesh=mesh)
    step = meshfeed.make_train_step(loss_fn, OPTIMIZER, mesh=mesh)
    history = meshfeed.fit(step, state, loader(mesh), num_steps=steps, log_every=1, progress=False)
    return [entry["loss"] for entry in history.train]


def train(mode: str, steps: int = STEPS, microbatches: int = 1) -> dict[str, np.ndarray]:
    """``steps`` steps in ``mode`` on a data-parallel mesh of every device."""
    mesh = meshfeed.make_mesh(data=jax.device_count())
    state = meshfeed.TrainState.create(init_params(), OPTIMIZER, mesh=mesh)
    step = meshfeed.make_train_step(
        loss_fn,
        OPTIMIZER,
        mesh=mesh,
        mode=mode,  # type: ignore[arg-type]
        microbatches=microbatches,
    )
    for _, batch in zip(range(steps), loader(mesh), strict=False):
        state, _ = step(state, batch)
    return {n: np.asarray(v) for n, v in state.params.items()}


def train_hybrid(mode: str = "jit", steps: int = STEPS) -> dict[str, np.ndarray]:
    """The hidden layer split over 'model' on data=4, model=2 (pmap: batch over both)."""
    mesh = meshfeed.make_mesh(data=4, model=2)
    specs = {"w1": P(None, "model"), "b1": P("model"), "w2": P("model", None)}
    params = {
        n: jax.make_array_from_callback(v.shape, NamedSharding(mesh, specs[n]), lambda i, v=v: v[i])
        for n, v in init_params().items()
    }
    state = meshfeed.TrainState.create(params, OPTIMIZER, mesh=mesh)
    assert state.params["w1"].sharding.spec == P(None, "model")
    axes = ("data", "model") if mode == "pmap" else ("data",)
    step = meshfeed.make_train_step(
        loss_fn,
        OPTIMIZER,
        mesh=mesh,
        mode=mode,  # type: ignore[arg-type]
        batch_axes=axes,
    )
    for _, batch in zip(range(steps), loader(mesh, axes), strict=False):
        state, _ = step(state, batch)
    assert state.params["w1"].sharding.spec == P(None, "model")
    # The kernel is sharded: gather it with a jitted identity into a replicated layout.
    gathered = jax.jit(lambda p: p, out_shardings=NamedSharding(mesh, P()))(state.params)
    return {n: np.asarray(v) for n, v in gathered.items()}


def fit_params(mode: str) -> dict[str, Any]:
    mesh = meshfeed.make_mesh(data=jax.device_count())
    state = meshfeed.TrainState.create(init_params(), OPTIMIZER, mesh=mesh)
    step = meshfeed.make_train_step(loss_fn, OPTIMIZER, mesh=mesh, mode=mode)  # type: ignore[arg-type]
    evaluation = meshfeed.Loader(
        source(),
        global_batch_size=GLOBAL_BATCH_SIZE,
        sharding=meshfeed.batch_sharding(mesh),
        shuffle=False,
        last_batch="pad",
    )
    history = meshfeed.fit(
        step,
        state,
        loader(mesh),
        num_steps=STEPS,
        eval_loader=evaluation,
        eval_fn=eval_fn,
        eval_every=10,
        log_every=5,
        progress=False,
    )
    return {
        "params": {n: np.asarray(v) for n, v in history.state.params.items()},
        "eval": history.eval,
        "train": history.train,
    }


def _local_copy(x: jax.Array) -> np.ndarray:
    """A replicated array's value, on any number of processes."""
    return np.asarray(x.addressable_shards[0].data)


def fit_with_checkpoints(
    directory: str, num_steps: int, every: int, storage_options: Any = None
) -> dict[str, Any]:
    """``fit`` for ``num_steps`` (the whole run's) with checkpoints under ``directory``."""
    mesh = meshfeed.make_mesh(data=jax.device_count())
    state = meshfeed.TrainState.create(init_params(), OPTIMIZER, mesh=mesh)
    step = meshfeed.make_train_step(loss_fn, OPTIMIZER, mesh=mesh, mode="jit")
    stream = loader(mesh)
    history = meshfeed.fit(
        step,
        state,
        stream,
        num_steps=num_steps,
        progress=False,
        checkpoint_dir=directory,
        checkpoint_every=every,
        storage_options=storage_options,
    )
    return {
        "params": {n: _local_copy(v) for n, v in history.state.params.items()},
        "step": stream.step,
        "steps": history.steps,
    }


def restore_and_peek(directory: str, seed: int = 4, storage_options: Any = None) -> dict[str, Any]:
    """Restores the newest checkpoint; the loader's position and its next batch's labels."""
    mesh = meshfeed.make_mesh(data=jax.device_count())
    target = meshfeed.TrainState.create(init_params(), OPTIMIZER, mesh=mesh)
    stream = meshfeed.Loader(
        source(),
        global_batch_size=GLOBAL_BATCH_SIZE,
        sharding=meshfeed.batch_sharding(mesh),
        last_batch="pad",
        num_epochs=None,
        seed=seed,
    )
    try:
        state = meshfeed.restore_checkpoint(
            directory, target, stream, storage_options=storage_options
        )
    except ValueError as error:
        return {"error": str(error)}
    batch = next(iter(stream))
    labels = [(s.index[0].start, np.asarray(s.data)) for s in batch["y"].addressable_shards]
    return {
        "step": stream.step - 1,
        "ids": stream.ids(stream.step - 1),
        "labels": labels,
        "w1": _local_copy(state.params["w1"]),
    }


def steps_and_shapes(n: int, last_batch: meshfeed.types.LastBatch) -> list[tuple[int, ...]]:
    """Every batch's global shape over one epoch of ``n`` examples (batch 8)."""
    mesh = meshfeed.make_mesh(data=jax.device_count())
    data = meshfeed.ArraySource({"x": np.arange(n * 3, dtype=np.float32).reshape(n, 3)})
    stream = meshfeed.Loader(
        data, global_batch_size=8, sharding=meshfeed.batch_sharding(mesh), last_batch=last_batch
    )
    return [tuple(batch["x"].shape) for batch in stream]


class _FailsOnProcessOne:
    """The training source, except that process 1's read of step 3 raises."""

    def __init__(self) -> None:
        self._source, self._reads = source(), 0

    @property
    def fields(self) -> Any:
        return self._source.fields

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        self._reads += 1
        if jax.process_index() == 1 and self._reads == 4:
            raise OSError("disk gone on process 1")
        return self._source[ids]


def fit_with_a_failing_read() -> None:
    mesh = meshfeed.make_mesh(data=jax.device_count())
    state = meshfeed.TrainState.create(init_params(), OPTIMIZER, mesh=mesh)
    step = meshfeed.make_train_step(loss_fn, OPTIMIZER, mesh=mesh)
    stream = meshfeed.Loader(
        _FailsOnProcessOne(),
        global_batch_size=GLOBAL_BATCH_SIZE,
        sharding=meshfeed.batch_sharding(mesh),
        num_epochs=None,
    )
    meshfeed.fit(step, state, stream, num_steps=50, progress=False)
