import re
import subprocess
import sys

import numpy as np
import pytest

keras = pytest.importorskip("keras", reason="the Keras tests need the keras extra")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

import keras_fns  # noqa: E402
import meshfeed  # noqa: E402
import meshfeed.keras  # noqa: E402
from meshfeed._cli import main  # noqa: E402
from meshfeed.testing import run_in_processes  # noqa: E402
from meshfeed.train import MODES  # noqa: E402


@pytest.fixture(scope="module")
def single_device():
    return keras_fns.train_single_device()


def _one_device():
    return meshfeed.make_mesh(data=1, devices=jax.devices()[:1])


def _assert_same_weights(got, want, rtol=1e-4, atol=1e-5):
    assert set(got) == set(want)
    for path in want:
        np.testing.assert_allclose(got[path], want[path], rtol=rtol, atol=atol, err_msg=path)


def test_data_parallel_on_8_devices_matches_one_device(single_device):
    result = keras_fns.train_data_parallel()
    # Weights, and the batch-norm statistics with them (non-trainable weights).
    assert any("moving_mean" in p for p in result["weights"])
    _assert_same_weights(result["weights"], single_device["weights"])
    np.testing.assert_allclose(result["losses"], single_device["losses"], rtol=1e-4)


@pytest.mark.multiprocess
def test_data_parallel_on_2_processes_matches_one_device(single_device):
    for result in run_in_processes(keras_fns.train_data_parallel):
        _assert_same_weights(result["weights"], single_device["weights"])


def test_layout_map_shards_dense_kernels_over_model_and_matches_one_device(single_device):
    result = keras_fns.train_model_parallel()
    assert result["kernel_spec"] == (None, "model")
    # Adam's iteration and learning rate replicated; the kernel's moments follow it.
    assert result["moment_specs"][2:4] == [(None, "model"), (None, "model")]
    _assert_same_weights(result["weights"], single_device["weights"])


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_matches_one_device_and_padded_rows_do_not_count(mode):
    # 36 examples: one device reads them as they are; eight get 64 rows, 28 of them
    # padding (mask False): four devices hold valid rows only, one holds both, three
    # padding only. Without batch norm (whose statistics padded rows would change) the
    # steps agree.
    many = keras_fns.padded_batches(meshfeed.make_mesh(data=8), 36, 64) * keras_fns.STEPS
    one = keras_fns.padded_batches(_one_device(), 36, 36) * keras_fns.STEPS
    assert int(many[0]["mask"].sum()) == 36
    want = keras_fns.train(_one_device(), norm=False, batches=one)
    got = keras_fns.train(meshfeed.make_mesh(data=8), norm=False, mode=mode, batches=many)
    _assert_same_weights(got["weights"], want["weights"])
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-5)


def test_manual_modes_normalise_per_device_and_agree():
    # Keras' BatchNormalization has no cross-device statistics on JAX: shard_map and
    # pmap each normalise a device's rows (the classic pmap recipe) and agree.
    mesh = meshfeed.make_mesh(data=8)
    shard_map = keras_fns.train(mesh, mode="shard_map", dropout=0.5)
    pmap = keras_fns.train(mesh, mode="pmap", dropout=0.5)
    _assert_same_weights(shard_map["weights"], pmap["weights"], rtol=1e-5, atol=1e-6)


def test_dropout_is_reproducible_and_fresh_each_step():
    mesh = meshfeed.make_mesh(data=8)
    first = keras_fns.train(mesh, dropout=0.5)
    second = keras_fns.train(mesh, dropout=0.5)
    np.testing.assert_array_equal(
        first["weights"]["hidden/kernel"], second["weights"]["hidden/kernel"]
    )
    reseeded = keras_fns.train(mesh, dropout=0.5, seed=1)["weights"]["hidden/kernel"]
    without = keras_fns.train(mesh)["weights"]["hidden/kernel"]
    for other in (reseeded, without):
        assert not np.allclose(first["weights"]["hidden/kernel"], other)
    # The seed generator's state went through the step and back into the model.
    initial = keras_fns.seed_states(keras_fns.model(0.5))
    assert first["seeds"] and not np.array_equal(first["seeds"][0], initial[0])


def test_fit_writes_back_so_predict_and_evaluate_agree_with_keras():
    mesh = meshfeed.make_mesh(data=8)
    net = keras_fns.model()
    evaluation = meshfeed.Loader(  # 256 rows: five batches of 48, the last one padded
        meshfeed.ArraySource(keras_fns.data()),
        global_batch_size=48,
        sharding=meshfeed.batch_sharding(mesh),
        shuffle=False,
        last_batch="pad",
    )
    history = meshfeed.keras.fit(
        net,
        keras_fns.loader(mesh),
        optimizer=keras_fns.optimizer(),
        loss=keras_fns.LOSS,
        metrics=["accuracy"],
        mesh=mesh,
        epochs=2,
        steps_per_epoch=5,
        eval_loader=evaluation,
        progress=False,
    )
    assert set(history.history) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert history.epoch == [0, 1]
    data = keras_fns.data()
    net.compile(loss=keras_fns.LOSS, metrics=["accuracy"])
    loss, accuracy = net.evaluate(data["x"], data["y"], batch_size=32, verbose=0)  # type: ignore[arg-type]  # keras annotates verbose as str
    assert history.history["val_accuracy"][-1] == pytest.approx(accuracy, rel=1e-5)
    assert history.history["val_loss"][-1] == pytest.approx(loss, rel=1e-4)
    predictions = net.predict(data["x"], verbose=0)  # type: ignore[arg-type]
    assert predictions.shape == (256, 3)


def test_an_optax_optimizer_trains_the_same_in_every_mode():
    mesh = meshfeed.make_mesh(data=8)
    net = keras_fns.model(norm=False)
    state = meshfeed.keras.create_state(net, optax.sgd(0.1), mesh=mesh)
    params = []
    for mode in MODES:
        step = meshfeed.keras.make_train_step(
            net, "sparse_categorical_crossentropy", optax.sgd(0.1), mesh=mesh, mode=mode
        )
        fresh = jax.tree.map(jnp.copy, state)  # each step donates the state it is given
        params.append(step(fresh, keras_fns.loader(mesh).batch(0))[0].params)
    for other in params[1:]:
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), params[0], other
        )


def test_keras_trainer_is_deprecated_and_still_trains():
    mesh = meshfeed.make_mesh(data=8)
    with pytest.warns(DeprecationWarning, match=r"use meshfeed\.keras\.fit"):
        trainer = meshfeed.keras.KerasTrainer(
            keras_fns.model(), optimizer=keras_fns.optimizer(), loss=keras_fns.LOSS, mesh=mesh
        )
    history = trainer.fit(keras_fns.loader(mesh), steps_per_epoch=2, progress=False)
    assert history.epoch == [0]
    assert set(trainer.evaluate(keras_fns.padded_batches(mesh, 40, 64))) == {"loss"}


@pytest.mark.parametrize("backend", ["torch", None])
def test_importing_without_the_jax_backend_says_how_to_fix_it(backend):
    env = {"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"}
    if backend:
        env["KERAS_BACKEND"] = backend
    run = subprocess.run(
        [sys.executable, "-c", "import meshfeed.keras"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode != 0
    assert "ImportError" in run.stderr and "KERAS_BACKEND=jax" in run.stderr


def test_bad_input_is_refused():
    mesh = meshfeed.make_mesh(data=8)
    net, adam = keras_fns.model(), keras_fns.optimizer()
    with pytest.raises(ValueError, match="build it first"):
        meshfeed.keras.create_state(keras.Sequential([keras.layers.Dense(3)]), adam, mesh=mesh)
    with pytest.raises(TypeError, match=r"pass a keras\.optimizers\.Optimizer"):
        meshfeed.keras.create_state(net, "adam", mesh=mesh)
    with pytest.raises(ValueError, match="cannot tell which accuracy"):
        meshfeed.keras.make_train_step(net, "mse", adam, mesh=mesh, metrics=["accuracy"])
    step = meshfeed.keras.make_train_step(net, keras_fns.LOSS, adam, mesh=mesh, x="image")
    state = meshfeed.keras.create_state(net, adam, mesh=mesh)
    with pytest.raises(ValueError, match=r"the model reads \['image'\]; pass x="):
        step(state, keras_fns.loader(mesh).batch(0))
    other = meshfeed.keras.create_state(
        keras_fns.model(norm=False), keras_fns.optimizer(), mesh=mesh
    )
    with pytest.raises(ValueError, match="do not match this model's variables"):
        meshfeed.keras.update_model(net, other)
    with pytest.raises(ValueError, match=r"steps_per_epoch=None: pass an int"):
        keras_fns.fit(mesh, net, keras_fns.padded_batches(mesh, 40, 64))
    wrong = keras_fns.model_parallel_layout(meshfeed.make_mesh(data=4, model=2))
    with pytest.raises(ValueError, match=r"names mesh axes \['model'\]"):
        meshfeed.keras.create_state(net, adam, mesh=mesh, layout_map=wrong)


def test_manual_modes_refuse_a_set_model_parallel_distribution():
    mesh = meshfeed.make_mesh(data=4, model=2)
    net = keras_fns.model()
    distribution = keras.distribution.ModelParallel(
        layout_map=keras_fns.model_parallel_layout(mesh), batch_dim_name="data"
    )
    keras.distribution.set_distribution(distribution)
    try:
        for mode in ("shard_map", "pmap"):
            with pytest.raises(ValueError, match="a Keras ModelParallel distribution is set"):
                meshfeed.keras.make_train_step(
                    net, keras_fns.LOSS, keras_fns.optimizer(), mesh=mesh, mode=mode
                )
        # jit takes the distribution's layouts.
        state = meshfeed.keras.create_state(net, keras_fns.optimizer(), mesh=mesh)
        assert tuple(state.params[0].sharding.spec) == (None, "model")
    finally:
        keras.distribution.set_distribution(None)


@pytest.mark.multiprocess
def test_keras_demo_reaches_95_percent(capsys):
    assert main(["demo", "--keras", "--epochs", "2"]) == 0  # 8 by default; ~98% at 2, 69% at 1
    out = capsys.readouterr().out
    accuracy = float(re.findall(r"test accuracy ([\d.]+)%", out)[0])
    assert accuracy >= 95.0, out


def test_the_keras_demos_epochs_are_refused_elsewhere(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--epochs", "2"])
    assert "--epochs is the Keras demo's (--keras)" in capsys.readouterr().err
