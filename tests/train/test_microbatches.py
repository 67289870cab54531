"""Microbatches inside a step, and parts of a step weighted by what the loss counts.

The update of ``microbatches=M`` equals the one big step's, and the three modes agree,
on packed rows whose loss is a mean over counted tokens (``metrics["count"]``) and on
padded rows whose loss is a mean over valid rows.
"""

import jax
import numpy as np
import pytest

import meshfeed
import microbatch_fns
import train_fns


@pytest.fixture(scope="module")
def big_step():
    """Three one-piece steps under jit: the loss the other runs must reproduce."""
    return microbatch_fns.train("jit", 1)


def _assert_same(got, want):
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("mode", meshfeed.train.MODES)
def test_packed_rows_give_the_big_steps_update_in_every_mode_and_split(mode, big_step):
    for microbatches in (1, 2, 4):
        got = microbatch_fns.train(mode, microbatches)
        _assert_same(got["params"], big_step["params"])
        for ours, theirs in zip(got["metrics"], big_step["metrics"], strict=True):
            assert ours["count"] == theirs["count"]  # the step's total, every mode
            assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-6)


@pytest.mark.parametrize("mode", meshfeed.train.MODES)
def test_padded_rows_split_in_two_give_single_device_training(mode):
    # 16 rows on 8 devices, one row a microbatch; step 6 holds 4 real rows of 16.
    _assert_same(train_fns.train(mode, microbatches=2), train_fns.reference_params())


def test_a_packed_loss_without_a_count_is_warned_of_and_differs():
    with pytest.warns(UserWarning, match="no 'count'"):
        got = microbatch_fns.train("shard_map", 1, loss_fn=microbatch_fns.uncounted_loss)
    want = microbatch_fns.train("jit", 1, loss_fn=microbatch_fns.uncounted_loss)
    # Rows weighted as rows, not as their tokens: another update than the global mean's.
    assert max(np.abs(got["params"][k] - want["params"][k]).max() for k in want["params"]) > 1e-3


def test_under_jit_each_device_keeps_its_rows():
    mesh = meshfeed.make_mesh(data=8)
    state = meshfeed.TrainState.create(
        microbatch_fns.init_params(), microbatch_fns.OPTIMIZER, mesh=mesh
    )
    batch = {
        name: jax.ShapeDtypeStruct((32, 32), dtype, sharding=meshfeed.batch_sharding(mesh))
        for name, dtype in [
            ("tokens", np.int32), ("segment_ids", np.int32), ("loss_mask", np.bool_)
        ]
    }  # fmt: skip
    step = meshfeed.make_train_step(
        microbatch_fns.counted_loss, microbatch_fns.OPTIMIZER, mesh=mesh, microbatches=4
    )
    compiled = step.lower(state, batch).compile().as_text()
    assert "all-to-all" not in compiled and "collective-permute" not in compiled


@pytest.mark.parametrize(
    ("microbatches", "match"),
    [(0, "must be a positive int"), (3, "must divide each device's rows")],
)
def test_bad_microbatches_are_refused(microbatches, match):
    mesh = meshfeed.make_mesh(data=8)
    with pytest.raises(ValueError, match=match):
        state = meshfeed.TrainState.create(train_fns.init_params(), train_fns.OPTIMIZER, mesh=mesh)
        step = meshfeed.make_train_step(
            train_fns.loss_fn, train_fns.OPTIMIZER, mesh=mesh, microbatches=microbatches
        )
        step(state, next(iter(train_fns.loader(mesh))))
