"""Flax NNX models trained by meshfeed equal a hand-written ``nnx.jit`` loop on one device."""

import gc

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshfeed
import meshfeed.flax as mflax

NUM_EXAMPLES = 256
BATCH = 32
STEPS = 20
OPTIMIZER = optax.sgd(0.05, momentum=0.9)


class CNN(nnx.Module):
    """Conv, BatchNorm, a hidden layer whose kernel is split over 'model', Dropout."""

    def __init__(self, *, dropout: float, rngs: nnx.Rngs) -> None:
        over_model = nnx.with_partitioning(nnx.initializers.lecun_normal(), (None, "model"))
        self.conv = nnx.Conv(1, 8, (3, 3), rngs=rngs)
        self.bn = nnx.BatchNorm(8, momentum=0.9, rngs=rngs)
        self.hidden = nnx.Linear(8 * 8 * 8, 32, kernel_init=over_model, rngs=rngs)
        self.drop = nnx.Dropout(dropout, rngs=rngs)
        self.out = nnx.Linear(32, 10, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = nnx.relu(self.bn(self.conv(x)))
        x = x.reshape(x.shape[0], -1)
        return self.out(self.drop(nnx.relu(self.hidden(x))))


def _data(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(NUM_EXAMPLES, 8, 8, 1)).astype(np.float32)
    y = (np.argmax(x[:, 2:6, 2:6, 0].reshape(NUM_EXAMPLES, -1), axis=1) % 10).astype(np.int32)
    return {"x": x + 0.5, "y": y}  # + 0.5: batch statistics far from the initial 0 and 1


def _loss(model, batch):
    logits = model(batch["x"])
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"])
    correct = (logits.argmax(-1) == batch["y"]).astype(np.float32)
    return meshfeed.masked_mean(loss, batch), {"accuracy": meshfeed.masked_mean(correct, batch)}


def _metrics(model, batch):
    return _loss(model, batch)[1]


MESH_AXES = {"jit": ("data",), "shard_map": ("data",), "pmap": ("data", "model")}


def _loader(mesh, mode, *, seed=3, data=None, num_epochs=None):
    return meshfeed.Loader(
        meshfeed.ArraySource(data or _data()),
        global_batch_size=BATCH,
        sharding=meshfeed.batch_sharding(mesh, MESH_AXES[mode]),
        num_epochs=num_epochs,
        seed=seed,
    )


def _train(
    mode, *, dropout=0.0, seed=0, steps=STEPS, checkpoint_dir=None, evaluate=False, rngs=None
):
    mesh = meshfeed.make_mesh(data=4, model=2)
    with jax.set_mesh(mesh):
        model = CNN(dropout=dropout, rngs=rngs or nnx.Rngs(0))
    state = mflax.create_state(model, OPTIMIZER, mesh=mesh, seed=seed)
    step = mflax.make_train_step(
        model, _loss, OPTIMIZER, mesh=mesh, mode=mode, batch_axes=MESH_AXES[mode]
    )
    extra = {}
    if evaluate:
        eval_loader = _loader(mesh, mode, data=_data(1), num_epochs=1)
        extra = {"eval_loader": eval_loader, "eval_fn": mflax.make_eval_fn(model, _metrics)}
    if checkpoint_dir is not None:
        extra |= {"checkpoint_dir": checkpoint_dir, "checkpoint_every": 5}
    history = meshfeed.fit(
        step, state, _loader(mesh, mode), num_steps=steps, progress=False, **extra
    )
    return model, history


def _hand_written():
    """The same model and batches, trained by a plain nnx.jit step on one device."""
    with nnx.use_eager_sharding(False):
        model = CNN(dropout=0.0, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, OPTIMIZER, wrt=nnx.Param)

    @nnx.jit
    def train_step(model, optimizer, x, y):
        def loss(model):
            logits = model(x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        grads = nnx.grad(loss)(model)
        optimizer.update(model, grads)

    batches = _loader(meshfeed.make_mesh(data=8), "jit")
    for _, batch in zip(range(STEPS), batches, strict=False):
        train_step(model, optimizer, jnp.asarray(batch["x"]), jnp.asarray(batch["y"]))
    model.eval()
    held_out = _data(1)
    logits = model(jnp.asarray(held_out["x"]))
    accuracy = float((logits.argmax(-1) == held_out["y"]).mean())
    return model, accuracy


@pytest.fixture(scope="module")
def reference():
    return _hand_written()


def _spec(x):
    assert isinstance(x.sharding, NamedSharding)
    return x.sharding.spec


def _values(model, kind):
    return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, kind)))


def _assert_close(got, want, **tolerance):
    flat_got = jax.tree_util.tree_flatten_with_path(got)[0]
    flat_want = jax.tree.leaves(want)
    assert len(flat_got) == len(flat_want)
    for (path, a), b in zip(flat_got, flat_want, strict=True):
        np.testing.assert_allclose(a, b, err_msg=jax.tree_util.keystr(path), **tolerance)


@pytest.mark.parametrize("mode", meshfeed.train.MODES)
def test_each_mode_trains_an_nnx_cnn_like_a_hand_written_nnx_jit_loop(mode, reference):
    model, history = _train(mode, evaluate=True)
    ref_model, ref_accuracy = reference
    # The model's arrays were the state's, which the first step donated.
    assert all(v.is_deleted() for v in jax.tree.leaves(nnx.state(model, nnx.Param)))
    mflax.update_model(model, history.state)
    after = _values(model, nnx.Param)
    # The trained values are in the user's model, the hidden kernel still over 'model'.
    _assert_close(after, _values(ref_model, nnx.Param), rtol=2e-4, atol=2e-5)
    _assert_close(
        _values(model, nnx.BatchStat), _values(ref_model, nnx.BatchStat), rtol=2e-4, atol=2e-5
    )
    assert _spec(model.hidden.kernel.get_value()) == P(None, "model")
    assert _spec(history.state.params["hidden"]["kernel"]) == P(None, "model")
    # fit evaluated the model in evaluation mode (running statistics) on held-out data.
    assert history.eval[-1]["accuracy"] == pytest.approx(ref_accuracy, abs=1e-6)
    # The model object keeps its own mode: train/eval are applied to copies.
    assert model.drop.deterministic is False and model.bn.use_running_average is False


def test_dropout_draws_from_the_state_key_reproducibly():
    first = _train("shard_map", dropout=0.5)[1].state.params
    again = _train("shard_map", dropout=0.5)[1].state.params
    other_seed = _train("shard_map", dropout=0.5, seed=1)[1].state.params
    no_dropout = _train("shard_map", dropout=0.0)[1].state.params
    _assert_close(again, first, rtol=0, atol=0)
    kernel = first["hidden"]["kernel"]
    assert not np.allclose(other_seed["hidden"]["kernel"], kernel, atol=1e-4)
    assert not np.allclose(no_dropout["hidden"]["kernel"], kernel, atol=1e-4)


def test_the_models_own_dropout_stream_does_not_matter():
    """Dropout masks come from ``state.rng``: the model's own ``nnx.Rngs`` dropout seed
    changes nothing (the docs say so; a hand-written loop's masks come from that seed)."""
    one = _train("jit", dropout=0.5, rngs=nnx.Rngs(params=0, dropout=7))[1].state.params
    other = _train("jit", dropout=0.5, rngs=nnx.Rngs(params=0, dropout=8))[1].state.params
    _assert_close(other, one, rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["jit", "pmap"])
def test_checkpoint_and_resume_reproduce_an_uninterrupted_run(mode, tmp_path):
    whole = _train(mode, dropout=0.5)[1].state
    _train(mode, dropout=0.5, steps=10, checkpoint_dir=tmp_path)
    model, resumed = _train(mode, dropout=0.5, checkpoint_dir=tmp_path)
    assert resumed.steps == STEPS and len(resumed.train) < STEPS  # it started at step 10
    for part in ("params", "model_state", "opt_state"):
        _assert_close(getattr(resumed.state, part), getattr(whole, part), rtol=0, atol=0)
    assert jax.random.key_data(resumed.state.rng).tolist() == [0, 0]
    mflax.update_model(model, resumed.state)
    assert _spec(model.hidden.kernel.get_value()) == P(None, "model")


class _Wide(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.first = nnx.Linear(256, 512, rngs=rngs)
        self.second = nnx.Linear(512, 256, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.second(nnx.relu(self.first(x)))


def _held_bytes(before: set[int]) -> int:
    gc.collect()
    live = [a for a in jax.live_arrays() if id(a) not in before and not a.is_deleted()]
    return sum(a.nbytes for a in live)


def test_the_values_are_held_once_after_create_state_and_a_step():
    def loss(model, batch):
        return jnp.mean((model(batch["x"]) - batch["x"]) ** 2), {}

    gc.collect()
    before = {id(a) for a in jax.live_arrays()}
    mesh = meshfeed.make_mesh(data=8)
    with nnx.use_eager_sharding(False):  # the model's arrays on one device, off the mesh
        model = _Wide(nnx.Rngs(0))
    params = sum(v.nbytes for v in jax.tree.leaves(nnx.state(model, nnx.Param)))
    optimizer = optax.adam(1e-3)
    state = mflax.create_state(model, optimizer, mesh=mesh)
    step = mflax.make_train_step(model, loss, optimizer, mesh=mesh)
    x = jax.device_put(np.ones((16, 256), np.float32), meshfeed.batch_sharding(mesh))
    state, metrics = step(state, {"x": x})
    jax.block_until_ready((state, metrics))
    del metrics
    optimizer_bytes = sum(v.nbytes for v in jax.tree.leaves(state.opt_state))
    held = _held_bytes(before | {id(x)})
    # Parameters once (the model's variables hold no other copy) plus Adam's two moments;
    # the rest is scalars (step, key, Adam's count).
    assert optimizer_bytes >= 2 * params
    assert params + optimizer_bytes <= held <= params + optimizer_bytes + 1024
    assert model.first.kernel.get_value().is_deleted()  # donated with the state
    mflax.update_model(model, state)
    assert model.first.kernel.get_value() is state.params["first"]["kernel"]
    assert _held_bytes(before | {id(x)}) == held
    # donate=False keeps the model usable through the steps (a second copy meanwhile).
    keep = mflax.make_train_step(model, loss, optimizer, mesh=mesh, donate=False)
    keep(state, {"x": x})
    assert model(jnp.ones((2, 256), jnp.float32)).shape == (2, 256)


@pytest.mark.parametrize("mode", ["jit", "shard_map"])
def test_microbatches_give_the_whole_steps_parameters(mode):
    def loss(model, batch):
        per_row = jnp.mean((model(batch["x"]) - batch["y"]) ** 2, axis=-1)
        return meshfeed.masked_mean(per_row, batch), {}

    mesh = meshfeed.make_mesh(data=8)
    rng = np.random.default_rng(0)
    rows = NamedSharding(mesh, P("data"))
    batch = {
        "x": jax.device_put(rng.normal(size=(32, 256)).astype(np.float32), rows),
        "y": jax.device_put(rng.normal(size=(32, 256)).astype(np.float32), rows),
        "mask": jax.device_put(np.arange(32) % 5 != 0, rows),  # some rows padding
    }
    trained = []
    for microbatches in (1, 4):
        with nnx.use_eager_sharding(False):
            model = _Wide(nnx.Rngs(0))
        optimizer = optax.sgd(0.5)  # Adam would magnify rounding where a gradient is ~0
        state = mflax.create_state(model, optimizer, mesh=mesh)
        step = mflax.make_train_step(
            model, loss, optimizer, mesh=mesh, mode=mode, microbatches=microbatches
        )
        for _ in range(2):
            state, _ = step(state, batch)
        trained.append(jax.tree.map(np.asarray, state.params))
    _assert_close(trained[1], jax.tree.leaves(trained[0]), rtol=1e-5, atol=1e-6)


def test_refuses_what_is_not_an_nnx_model_or_its_state():
    mesh = meshfeed.make_mesh(data=8)
    with pytest.raises(TypeError, match=r"pass a flax\.nnx\.Module"):
        mflax.create_state({"w": np.zeros(3)}, OPTIMIZER, mesh=mesh)
    with nnx.use_eager_sharding(False):
        model = CNN(dropout=0.0, rngs=nnx.Rngs(0))
        other = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    state = mflax.create_state(other, OPTIMIZER, mesh=mesh)
    with pytest.raises(ValueError, match="do not have this model's structure"):
        mflax.update_model(model, state)
