import re
import subprocess
import sys

import numpy as np
import pytest

keras = pytest.importorskip("keras", reason="the Keras tests need the keras extra")

import keras_fns  # noqa: E402
import meshfeed  # noqa: E402
from meshfeed._cli import main  # noqa: E402
from meshfeed.keras import KerasTrainer  # noqa: E402
from meshfeed.testing import run_in_processes  # noqa: E402


@pytest.fixture(scope="module")
def single_device():
    return keras_fns.train_single_device()


def _assert_same_weights(got, want):
    assert set(got) == set(want)
    for path in want:
        np.testing.assert_allclose(got[path], want[path], rtol=1e-4, atol=1e-5, err_msg=path)


def test_data_parallel_on_8_devices_matches_one_device(single_device):
    result = keras_fns.train_data_parallel()
    # Weights, and the batch-norm statistics with them (non-trainable weights).
    assert any("moving_mean" in p for p in result["weights"])
    _assert_same_weights(result["weights"], single_device["weights"])
    np.testing.assert_allclose(
        result["history"]["loss"], single_device["history"]["loss"], rtol=1e-4
    )


@pytest.mark.multiprocess
def test_data_parallel_on_2_processes_matches_one_device(single_device):
    for result in run_in_processes(keras_fns.train_data_parallel):
        _assert_same_weights(result["weights"], single_device["weights"])


def test_layout_map_shards_dense_kernels_over_model_and_matches_one_device(single_device):
    result = keras_fns.train_model_parallel()
    assert result["kernel_spec"] == (None, "model")
    _assert_same_weights(result["weights"], single_device["weights"])


def test_dropout_is_reproducible_and_fresh_each_step():
    mesh = meshfeed.make_mesh(data=8)
    first = keras_fns.train(mesh, dropout=0.5)
    second = keras_fns.train(mesh, dropout=0.5)
    _assert_same_weights(first["weights"], second["weights"])
    without = keras_fns.train(mesh)["weights"]
    assert not np.allclose(first["weights"]["hidden/kernel"], without["hidden/kernel"])
    # The dropout seed state was carried through the step and advanced, step after step.
    initial = keras_fns.seed_states(keras_fns.model(0.5))
    assert first["seeds"] and not np.array_equal(first["seeds"][0], initial[0])


def test_fit_writes_back_so_predict_and_evaluate_work():
    mesh = meshfeed.make_mesh(data=8)
    net = keras_fns.model()
    trainer = keras_fns.trainer(mesh, net)
    evaluation = meshfeed.Loader(
        meshfeed.ArraySource(keras_fns.data()),
        global_batch_size=32,
        sharding=meshfeed.batch_sharding(mesh),
        shuffle=False,
        last_batch="pad",
    )
    history = trainer.fit(
        keras_fns.loader(mesh), epochs=2, steps_per_epoch=5, eval_loader=evaluation, progress=False
    )
    assert set(history.history) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert history.epoch == [0, 1]
    results = trainer.evaluate(evaluation)
    data = keras_fns.data()
    net.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"]
    )
    loss, accuracy = net.evaluate(data["x"], data["y"], batch_size=32, verbose=0)  # type: ignore[arg-type]  # keras annotates verbose as str
    assert results["accuracy"] == pytest.approx(accuracy, rel=1e-5)
    assert results["loss"] == pytest.approx(loss, rel=1e-4)
    predictions = net.predict(data["x"], verbose=0)  # type: ignore[arg-type]
    assert predictions.shape == (256, 3)


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
    unbuilt = keras.Sequential([keras.layers.Dense(3)])
    with pytest.raises(ValueError, match="build it first"):
        keras_fns.trainer(mesh, unbuilt)
    with pytest.raises(TypeError, match=r"pass a keras\.optimizers\.Optimizer"):
        KerasTrainer(keras_fns.model(), optimizer="adam", loss="mse", mesh=mesh)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cannot tell which accuracy"):
        KerasTrainer(
            keras_fns.model(),
            optimizer=keras.optimizers.SGD(),
            loss="mse",
            metrics=["accuracy"],
            mesh=mesh,
        )
    trainer = KerasTrainer(
        keras_fns.model(),
        optimizer=keras.optimizers.SGD(),
        loss="sparse_categorical_crossentropy",
        mesh=mesh,
        x="image",
    )
    with pytest.raises(ValueError, match=r"trainer reads \['image'\]; pass KerasTrainer"):
        trainer.fit(keras_fns.loader(mesh), steps_per_epoch=1, progress=False)


@pytest.mark.multiprocess
def test_keras_demo_reaches_95_percent(capsys):
    assert main(["demo", "--keras"]) == 0
    out = capsys.readouterr().out
    accuracy = float(re.findall(r"test accuracy ([\d.]+)%", out)[0])
    assert accuracy >= 95.0, out
