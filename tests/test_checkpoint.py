"""Checkpoints: fit resumes by itself, on any topology, and refuses another run's state."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import meshfeed
import train_fns
from meshfeed.testing import run_in_processes
from train_fns import fit_with_checkpoints, restore_and_peek, source


def _equal(a, b, rtol=1e-6):
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=rtol, atol=1e-7)


def test_fit_resumes_from_its_newest_checkpoint(tmp_path):
    whole = fit_with_checkpoints(str(tmp_path / "whole"), num_steps=10, every=100)
    first = fit_with_checkpoints(str(tmp_path / "run"), num_steps=6, every=4)
    assert first["steps"] == 6
    again = fit_with_checkpoints(str(tmp_path / "run"), num_steps=10, every=4)
    assert again["step"] == 10  # resumed at 6, not restarted
    _equal(again["params"], whole["params"])
    done = fit_with_checkpoints(str(tmp_path / "run"), num_steps=10, every=4)
    assert done["steps"] == 10  # nothing left to do
    _equal(done["params"], whole["params"])


@pytest.mark.multiprocess
def test_a_two_process_checkpoint_restores_on_one_and_four(tmp_path):
    saved = str(tmp_path / "two")
    run_in_processes(fit_with_checkpoints, saved, 6, 3, num_processes=2, devices_per_process=4)
    copy = str(tmp_path / "copy")
    shutil.copytree(saved, copy)
    on_one = restore_and_peek(saved)  # this process: 1 x 8
    on_four = run_in_processes(restore_and_peek, copy, num_processes=4, devices_per_process=2)
    whole = fit_with_checkpoints(str(tmp_path / "whole"), num_steps=6, every=100)
    np.testing.assert_allclose(on_one["w1"], whole["params"]["w1"], rtol=1e-5, atol=1e-7)
    labels = source()[np.maximum(on_one["ids"], 0)]["y"]
    for result in [on_one, *on_four]:
        assert result["step"] == 6
        np.testing.assert_array_equal(result["ids"], on_one["ids"])
        np.testing.assert_allclose(result["w1"], on_one["w1"], rtol=1e-5, atol=1e-7)
        for start, shard in result["labels"]:
            np.testing.assert_array_equal(shard, labels[start : start + len(shard)])


def test_a_checkpoint_from_another_seed_is_refused(tmp_path):
    fit_with_checkpoints(str(tmp_path / "run"), num_steps=2, every=2)
    refused = restore_and_peek(str(tmp_path / "run"), seed=5)
    assert refused["error"].startswith("the state is from another seed: seed=4 in the state")


def test_checkpoint_arguments_are_checked(tmp_path):
    with pytest.raises(ValueError, match="checkpoint_every needs checkpoint_dir"):
        meshfeed.fit(lambda s, b: (s, {}), None, [], num_steps=1, checkpoint_every=2)
    with pytest.raises(TypeError, match=r"checkpoint_dir needs a meshfeed\.Loader"):
        meshfeed.fit(lambda s, b: (s, {}), None, [], num_steps=1, checkpoint_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no checkpoint under"):
        meshfeed.restore_checkpoint(tmp_path / "empty", {"x": np.zeros(2)})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"log_every": 0}, "log_every=0 must be >= 1"),
        ({"num_steps": 0}, "num_steps=0 must be an int >= 1"),
        ({"eval_fn": train_fns.eval_fn}, "pass eval_loader and eval_fn together"),
        ({"checkpoint_every": 0}, "checkpoint_every=0 must be an int >= 1"),
    ],
)
def test_fit_checks_every_argument_before_it_touches_the_checkpoint_dir(tmp_path, kwargs, match):
    mesh = meshfeed.make_mesh(data=8)
    state = meshfeed.TrainState.create(train_fns.init_params(), train_fns.OPTIMIZER, mesh=mesh)
    step = meshfeed.make_train_step(train_fns.loss_fn, train_fns.OPTIMIZER, mesh=mesh)
    directory = tmp_path / "run"
    args = {"checkpoint_dir": str(directory), "checkpoint_every": 2, "num_steps": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        meshfeed.fit(step, state, train_fns.loader(mesh), **args)
    assert not directory.exists()
