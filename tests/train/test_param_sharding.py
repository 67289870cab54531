"""Parameters and optimizer state laid out over the mesh: ``param_sharding="fsdp"`` splits
the large ones over the data axis (with a model axis too), a rule lays out each itself;
the steps compute what the replicated state computes; a step donates the state."""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshfeed
from meshfeed.train import MODES

OPTIMIZER = optax.adam(1e-2)
STEPS = 10


def _loss(params, batch):
    h = jnp.tanh(batch["x"] @ params["w1"] + params["b1"])
    error = (h @ params["w2"] - batch["y"]) ** 2
    return meshfeed.masked_mean(error.sum(-1), batch), {}


def _init():
    rng = np.random.default_rng(0)
    return {
        "w1": (rng.normal(size=(64, 1024)) * 0.1).astype(np.float32),  # 2^16 elements
        "b1": np.zeros(1024, np.float32),  # small: stays whole
        "w2": (rng.normal(size=(1024, 96)) * 0.1).astype(np.float32),
    }


def _batches(mesh):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(STEPS * 16, 64)).astype(np.float32)
    y = rng.normal(size=(STEPS * 16, 96)).astype(np.float32)
    rows = NamedSharding(mesh, P("data"))
    return [
        {"x": jax.device_put(x[k * 16 : k * 16 + 16], rows),
         "y": jax.device_put(y[k * 16 : k * 16 + 16], rows)}
        for k in range(STEPS)
    ]  # fmt: skip


def _params(mesh, hybrid):
    params = dict(_init())
    if hybrid:  # the hidden layer over 'model', as a user places it
        params["w1"] = jax.device_put(params["w1"], NamedSharding(mesh, P(None, "model")))
        params["w2"] = jax.device_put(params["w2"], NamedSharding(mesh, P("model", None)))
    return params


def _train(mesh, mode, param_sharding, hybrid=False):
    state = meshfeed.TrainState.create(
        _params(mesh, hybrid), OPTIMIZER, mesh=mesh, param_sharding=param_sharding
    )
    step = meshfeed.make_train_step(_loss, OPTIMIZER, mesh=mesh, mode=mode)
    for batch in _batches(mesh):
        state, _ = step(state, batch)
    return state


def _held(x):
    """The share of ``x`` one device holds."""
    return x.addressable_shards[0].data.size / x.size


@pytest.fixture(scope="module")
def replicated():
    state = _train(meshfeed.make_mesh(data=8), "jit", None)
    return jax.tree.map(np.asarray, state.params)


@pytest.mark.parametrize("mode", MODES)
def test_fsdp_splits_large_parameters_and_their_optimizer_state_and_trains_the_same(
    mode, replicated
):
    mesh = meshfeed.make_mesh(data=8)
    state = meshfeed.TrainState.create(_init(), OPTIMIZER, mesh=mesh, param_sharding="fsdp")
    leaves = jax.tree_util.tree_flatten_with_path((state.params, state.opt_state))[0]
    large = [(jax.tree_util.keystr(p), x) for p, x in leaves if x.size >= 2**16]
    assert len(large) == 6  # w1, w2 and Adam's mu and nu of each
    assert all(_held(x) == 1 / 8 for _, x in large), [(p, x.sharding.spec) for p, x in large]
    assert state.params["w1"].sharding.spec == P(None, "data")  # its largest dimension
    assert _held(state.params["b1"]) == 1.0
    trained = _train(mesh, mode, "fsdp")
    assert trained.params["w2"].sharding.spec == P("data", None)  # the layout kept
    for name, want in replicated.items():
        np.testing.assert_allclose(trained.params[name], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["jit", "shard_map"])
def test_fsdp_composes_with_a_model_axis(mode, replicated):
    mesh = meshfeed.make_mesh(data=4, model=2)
    state = meshfeed.TrainState.create(
        _params(mesh, hybrid=True), OPTIMIZER, mesh=mesh, param_sharding="fsdp"
    )
    assert state.params["w1"].sharding.spec == P("data", "model")
    assert state.params["w2"].sharding.spec == P("model", "data")
    mu = state.opt_state[0].mu
    assert all(_held(x) == 1 / 8 for x in (*state.params.values(), *mu.values()) if x.size >= 2**16)
    trained = _train(mesh, mode, "fsdp", hybrid=True)
    for name, want in replicated.items():
        np.testing.assert_allclose(trained.params[name], want, rtol=1e-5, atol=1e-5)


def test_a_rule_lays_out_each_parameter_and_none_keeps_the_default():
    mesh = meshfeed.make_mesh(data=4, model=2)

    def rule(path, leaf):
        return P(None, "model") if path == "['w1']" else None

    state = meshfeed.TrainState.create(_init(), OPTIMIZER, mesh=mesh, param_sharding=rule)
    assert state.params["w1"].sharding.spec == P(None, "model")
    assert state.params["w2"].sharding.spec == P()
    assert state.opt_state[0].nu["w1"].sharding.spec == P(None, "model")  # follows w1


def test_bad_param_sharding_is_refused_with_the_fix():
    mesh = meshfeed.make_mesh(data=8)
    with pytest.raises(ValueError, match=r"param_sharding='zero3' is unknown; pass 'fsdp'"):
        meshfeed.TrainState.create(_init(), OPTIMIZER, mesh=mesh, param_sharding="zero3")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"mesh axis 'data', which the mesh \{'batch': 8\}"):
        other = meshfeed.make_mesh(batch=8)
        meshfeed.TrainState.create(_init(), OPTIMIZER, mesh=other, param_sharding="fsdp")
    with pytest.raises(TypeError, match=r"returned 'data' for \['b1'\]; return a jax.sharding"):
        meshfeed.TrainState.create(
            _init(),
            OPTIMIZER,
            mesh=mesh,
            param_sharding=lambda path, leaf: "data",  # type: ignore[arg-type]
        )


@pytest.mark.parametrize("mode", MODES)
def test_a_step_donates_the_state_it_is_given_unless_told_not_to(mode):
    mesh = meshfeed.make_mesh(data=8)
    batch = _batches(mesh)[0]
    for donate in (True, False):
        state = meshfeed.TrainState.create(_init(), OPTIMIZER, mesh=mesh, param_sharding="fsdp")
        step = meshfeed.make_train_step(_loss, OPTIMIZER, mesh=mesh, mode=mode, donate=donate)
        new, _ = step(state, batch)
        leaves = jax.tree.leaves((state.step, state.params, state.opt_state))
        assert all(x.is_deleted() == donate for x in leaves), mode
        assert not any(x.is_deleted() for x in jax.tree.leaves(new))
        with pytest.raises(RuntimeError, match="deleted") if donate else contextlib.nullcontext():
            np.asarray(state.params["w1"])
        again = pytest.raises(ValueError, match="donated to an earlier step")
        with again if donate else contextlib.nullcontext():
            step(state, batch)  # the donated state again: said, not a crash
