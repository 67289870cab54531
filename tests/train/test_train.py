import jax
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshfeed
import train_fns
from meshfeed.testing import run_in_processes


@pytest.fixture(scope="module")
def reference():
    return train_fns.reference_params()


def _assert_same_params(got, want):
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("mode", meshfeed.train.MODES)
def test_each_mode_on_8_devices_matches_single_device_training(mode, reference):
    _assert_same_params(train_fns.train(mode), reference)


@pytest.mark.multiprocess
def test_each_mode_on_2_processes_matches_single_device_training(reference):
    results = run_in_processes(_train_every_mode, num_processes=2, devices_per_process=4)
    for per_process in results:
        for mode in meshfeed.train.MODES:
            _assert_same_params(per_process[mode], reference)


def _train_every_mode():
    return {mode: train_fns.train(mode) for mode in meshfeed.train.MODES}


@pytest.mark.parametrize("mode", meshfeed.train.MODES)
def test_hybrid_mlp_with_hidden_layer_over_model_matches_single_device(mode, reference):
    # shard_map and pmap take the kernel whole and give it back over 'model'.
    _assert_same_params(train_fns.train_hybrid(mode), reference)


@pytest.mark.parametrize("mode", meshfeed.train.MODES)
def test_each_step_function_compiles_once(mode):
    compiles = []

    def listener(event, duration_secs, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    mesh = meshfeed.make_mesh(data=8)
    state = meshfeed.TrainState.create(train_fns.init_params(), train_fns.OPTIMIZER, mesh=mesh)
    step = meshfeed.make_train_step(train_fns.loss_fn, train_fns.OPTIMIZER, mesh=mesh, mode=mode)
    batches = list(zip(range(8), train_fns.loader(mesh), strict=False))
    state, _ = step(state, batches[0][1])
    jax.block_until_ready(state)
    jax.monitoring.register_event_duration_secs_listener(listener)
    metrics = None
    try:
        for _, batch in batches[1:]:  # includes the padded step 7
            state, metrics = step(state, batch)
        jax.block_until_ready((state, metrics))
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiles == []


@pytest.mark.parametrize("mode", meshfeed.train.MODES)
def test_padded_rows_do_not_count_in_the_loss(mode):
    mesh = meshfeed.make_mesh(data=8)
    loader = train_fns.loader(mesh)
    padded_step = 6  # the 7th step of epoch 0 holds 100 - 6 * 16 = 4 real rows
    ids = loader.ids(padded_step)
    assert (ids >= 0).sum() == 4
    batch = loader.batch(padded_step)
    state = meshfeed.TrainState.create(train_fns.init_params(), train_fns.OPTIMIZER, mesh=mesh)
    step = meshfeed.make_train_step(train_fns.loss_fn, train_fns.OPTIMIZER, mesh=mesh, mode=mode)
    _, metrics = step(state, batch)
    real = train_fns.source()[ids[ids >= 0]]
    loss, correct = train_fns.per_row_loss(train_fns.init_params(), real)
    np.testing.assert_allclose(float(metrics["loss"]), float(np.mean(loss)), rtol=1e-6)
    np.testing.assert_allclose(float(metrics["accuracy"]), float(np.mean(correct)), rtol=1e-6)


def test_masked_mean_ignores_padding_and_survives_an_all_padding_batch():
    values = np.array([1.0, 2.0, 30.0], np.float32)
    assert float(meshfeed.masked_mean(values, {"mask": np.array([True, True, False])})) == 1.5
    assert float(meshfeed.masked_mean(values, {"mask": np.zeros(3, bool)})) == 0.0
    assert float(meshfeed.masked_mean(values, {})) == 11.0


def test_fit_trains_evaluates_and_reports(reference):
    result = train_fns.fit_params("jit")
    _assert_same_params(result["params"], reference)
    assert [e["step"] for e in result["eval"]] == [10.0, 20.0]
    assert 0.0 <= result["eval"][-1]["accuracy"] <= 1.0
    assert [t["step"] for t in result["train"]] == [5.0, 10.0, 15.0, 20.0]
    assert all(0.0 <= t["input_wait_share"] <= 1.0 for t in result["train"])


@pytest.mark.multiprocess
def test_fit_on_2_processes_matches_single_device(reference):
    results = run_in_processes(train_fns.fit_params, "shard_map")
    for r in results:
        _assert_same_params(r["params"], reference)
    assert results[0]["eval"] == results[1]["eval"]


@pytest.mark.parametrize("progress", [True, False])
def test_fit_reports_a_line_per_log_and_evaluation_off_a_terminal_unless_told_not_to(
    progress, capsys
):
    """The training guide's claim: off a terminal (here, captured) ``fit`` prints a line
    per log and per evaluation; ``progress=False`` prints nothing, the History keeps it."""
    mesh = meshfeed.make_mesh(data=8)
    state = meshfeed.TrainState.create(train_fns.init_params(), train_fns.OPTIMIZER, mesh=mesh)
    step = meshfeed.make_train_step(train_fns.loss_fn, train_fns.OPTIMIZER, mesh=mesh)
    evaluation = meshfeed.Loader(
        train_fns.source(), global_batch_size=64, sharding=meshfeed.batch_sharding(mesh),
        shuffle=False, last_batch="pad",
    )  # fmt: skip
    history = meshfeed.fit(
        step, state, train_fns.loader(mesh), num_steps=4, log_every=2, progress=progress,
        eval_loader=evaluation, eval_fn=train_fns.eval_fn, eval_every=4,
    )  # fmt: skip
    out = capsys.readouterr().out
    if progress:
        assert "step 2/4" in out and "step 4/4" in out and "samples/s" in out
        assert "input wait" in out and "eval at step 4: accuracy" in out
    else:
        assert out == ""
    assert history.steps == 4 and int(history.state.step) == 4
    assert [t["step"] for t in history.train] == [2.0, 4.0] and len(history.eval) == 1


# -- bad input ---------------------------------------------------------------------------


def _mesh():
    return meshfeed.make_mesh(data=4, model=2)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"mode": "vmap"}, ValueError, r"mode='vmap' is unknown; pass one of \['jit'"),
        ({"batch_axes": ("rows",)}, ValueError, r"batch_axes=\('rows',\) must name axes of"),
        ({"mode": "pmap"}, ValueError, r"cover 4 of the 8 devices.*mode='jit' for hybrid"),
        ({"mesh": "mesh"}, TypeError, "mesh is a str; pass a jax.sharding.Mesh"),
    ],
)
def test_make_train_step_refuses_bad_input(kwargs, error, match):
    args = {"mesh": _mesh(), **kwargs}
    with pytest.raises(error, match=match):
        meshfeed.make_train_step(train_fns.loss_fn, optax.sgd(0.1), **args)


def test_shard_map_refuses_a_batch_sharded_beyond_the_batch_dimension():
    mesh = _mesh()
    state = meshfeed.TrainState.create(train_fns.init_params(), train_fns.OPTIMIZER, mesh=mesh)
    step = meshfeed.make_train_step(
        train_fns.loss_fn, train_fns.OPTIMIZER, mesh=mesh, mode="shard_map"
    )
    batch = {
        "x": jax.device_put(np.zeros((8, 6), np.float32), NamedSharding(mesh, P("data", "model"))),
        "y": jax.device_put(np.zeros(8, np.int32), NamedSharding(mesh, P("data"))),
    }
    with pytest.raises(ValueError, match=r"field 'x' has .*or use mode='jit'"):
        step(state, batch)


def test_fit_refuses_an_endless_loader_without_num_steps():
    mesh = meshfeed.make_mesh(data=8)
    state = meshfeed.TrainState.create(train_fns.init_params(), train_fns.OPTIMIZER, mesh=mesh)
    step = meshfeed.make_train_step(train_fns.loss_fn, train_fns.OPTIMIZER, mesh=mesh)
    with pytest.raises(ValueError, match=r"endless.*pass num_steps="):
        meshfeed.fit(step, state, train_fns.loader(mesh))
    with pytest.raises(ValueError, match="eval_loader and eval_fn together"):
        meshfeed.fit(step, state, train_fns.loader(mesh), num_steps=2, eval_fn=train_fns.eval_fn)
