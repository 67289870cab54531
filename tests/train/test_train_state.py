"""Model state and keys in the train state: every mode, and the refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meshfeed
import train_fns
from meshfeed.testing import run_in_processes

MOMENTUM = 0.8


def _stateful_loss(params, batch, model_state, rng):
    """Centres the inputs with a running mean it updates; adds noise drawn from ``rng``."""
    x = batch["x"] - model_state["mean"]
    loss, correct = train_fns.per_row_loss(params, {**batch, "x": x})
    mask = batch["mask"].astype(jnp.float32)[:, None]
    batch_mean = jnp.sum(batch["x"] * mask, 0) / jnp.maximum(jnp.sum(mask), 1.0)
    new_state = {
        "mean": MOMENTUM * model_state["mean"] + (1 - MOMENTUM) * batch_mean,
        "calls": model_state["calls"] + 1,
    }
    noise = jax.random.uniform(rng, ())
    metrics = {"accuracy": meshfeed.masked_mean(correct, batch), "noise": noise}
    return meshfeed.masked_mean(loss, batch), (metrics, new_state)


def _state(mesh, seed=7):
    model_state = {"mean": np.zeros(6, np.float32), "calls": np.zeros((), np.int32)}
    return meshfeed.TrainState.create(
        train_fns.init_params(), train_fns.OPTIMIZER, mesh=mesh, model_state=model_state, rng=seed
    )


def _run(mode, steps=12, seed=7):
    mesh = meshfeed.make_mesh(data=8)
    state = _state(mesh, seed)
    step = meshfeed.make_train_step(
        _stateful_loss, train_fns.OPTIMIZER, mesh=mesh, mode=mode, stateful=True
    )
    noise = []
    for _, batch in zip(range(steps), train_fns.loader(mesh), strict=False):
        state, metrics = step(state, batch)
        noise.append(float(metrics["noise"]))
    return state, noise


@pytest.fixture(scope="module")
def jit_run():
    return _run("jit")


@pytest.mark.parametrize("mode", ["shard_map", "pmap"])
def test_model_state_in_the_manual_modes_equals_jit_on_the_global_batch(mode, jit_run):
    # Each device's running mean over its rows, averaged by valid rows, is the global
    # one: padded steps included (step 7 of each epoch holds 4 rows of 16).
    state, _ = _run(mode)
    want, _ = jit_run
    np.testing.assert_allclose(state.model_state["mean"], want.model_state["mean"], rtol=1e-5)
    assert int(state.model_state["calls"]) == 12
    for name in want.params:
        np.testing.assert_allclose(state.params[name], want.params[name], rtol=1e-5, atol=1e-6)


def _every_mode_here():
    out = {}
    for mode in meshfeed.train.MODES:
        state, noise = _run(mode)
        here = {"mean": state.model_state["mean"], "w1": state.params["w1"]}
        out[mode] = {k: np.asarray(v.addressable_shards[0].data) for k, v in here.items()}
        out[mode]["noise"] = noise
    return out


@pytest.mark.multiprocess
def test_model_state_and_keys_on_2_processes_equal_one_process(jit_run):
    want, noise = jit_run
    for per_process in run_in_processes(_every_mode_here):
        for got in per_process.values():
            np.testing.assert_allclose(got["mean"], want.model_state["mean"], rtol=1e-5)
            np.testing.assert_allclose(got["w1"], want.params["w1"], rtol=1e-5, atol=1e-6)
        assert per_process["jit"]["noise"] == noise  # the same keys, whatever the processes


def test_each_step_draws_a_new_key_reproducibly_and_the_state_key_stays(jit_run):
    state, noise = jit_run
    assert state.rng is not None
    assert len(set(noise)) == len(noise)
    assert _run("jit")[1] == noise
    assert _run("jit", seed=8)[1] != noise
    assert (
        jax.random.key_data(state.rng).tolist() == jax.random.key_data(jax.random.key(7)).tolist()
    )


def test_rng_accepts_seeds_and_keys_and_refuses_the_rest():
    mesh = meshfeed.make_mesh(data=8)
    params, opt = train_fns.init_params(), train_fns.OPTIMIZER
    by_seed = meshfeed.TrainState.create(params, opt, mesh=mesh, rng=3).rng
    by_key = meshfeed.TrainState.create(params, opt, mesh=mesh, rng=jax.random.key(3)).rng
    by_raw = meshfeed.TrainState.create(params, opt, mesh=mesh, rng=jax.random.PRNGKey(3)).rng
    assert by_seed is not None and by_key is not None and by_raw is not None
    for key in (by_key, by_raw):
        assert jax.random.key_data(key).tolist() == jax.random.key_data(by_seed).tolist()
    assert by_seed.sharding.is_fully_replicated and len(by_seed.sharding.device_set) == 8
    with pytest.raises(TypeError, match=r"pass an int or jax.random.key\(seed\)"):
        meshfeed.TrainState.create(params, opt, mesh=mesh, rng="seven")  # type: ignore[arg-type]


def test_a_state_with_model_state_needs_a_stateful_loss_and_its_return_shape():
    mesh = meshfeed.make_mesh(data=8)
    batch = next(iter(train_fns.loader(mesh)))
    plain = meshfeed.make_train_step(train_fns.loss_fn, train_fns.OPTIMIZER, mesh=mesh)
    with pytest.raises(ValueError, match=r"pass stateful=True and write loss_fn\(params, batch"):
        plain(_state(mesh), batch)

    def forgot_the_state(params, batch, model_state, rng):
        return train_fns.loss_fn(params, batch)

    step = meshfeed.make_train_step(forgot_the_state, train_fns.OPTIMIZER, mesh=mesh, stateful=True)
    with pytest.raises(TypeError, match=r"returns \(loss, \(metrics, new_model_state\)\)"):
        step(_state(mesh), batch)


def _save_and_restore(directory):
    mesh = meshfeed.make_mesh(data=8)
    state, _ = _run("shard_map", steps=3)
    meshfeed.save_checkpoint(directory, 3, state)
    restored = meshfeed.restore_checkpoint(directory, _state(mesh, seed=0))
    assert restored.rng is not None
    return {
        "step": int(restored.step.addressable_shards[0].data),
        "rng": np.asarray(jax.random.key_data(restored.rng).addressable_shards[0].data),
        "mean": np.asarray(restored.model_state["mean"].addressable_shards[0].data),
        "want": np.asarray(state.model_state["mean"].addressable_shards[0].data),
    }


@pytest.mark.multiprocess
def test_checkpoints_hold_model_state_and_the_key_on_2_processes(tmp_path):
    for got in run_in_processes(_save_and_restore, str(tmp_path)):
        assert got["step"] == 3
        assert got["rng"].tolist() == jax.random.key_data(jax.random.key(7)).tolist()
        np.testing.assert_array_equal(got["mean"], got["want"])
