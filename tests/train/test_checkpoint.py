"""Checkpoints: fit resumes by itself, on any topology, and refuses another run's state."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import s3fs

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
def test_a_two_process_checkpoint_on_s3_restores_on_one_and_four(server, monkeypatch):
    # TensorStore, which writes the arrays, finds the keys in the environment.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    url, options = "s3://data/two-processes", server.storage_options
    run_in_processes(fit_with_checkpoints, url, 6, 3, options, num_processes=2,
                     devices_per_process=4)  # fmt: skip
    assert sorted(p.rsplit("/", 1)[-1] for p in s3fs.S3FileSystem(**options).ls(url)) == ["3", "6"]
    on_one = restore_and_peek(url, storage_options=options)  # this process: 1 x 8
    on_four = run_in_processes(restore_and_peek, url, 4, options, num_processes=4,
                               devices_per_process=2)  # fmt: skip
    whole = train_fns.train("jit", 6)
    np.testing.assert_allclose(on_one["w1"], whole["w1"], rtol=1e-5, atol=1e-7)
    labels = source()[np.maximum(on_one["ids"], 0)]["y"]
    for result in [on_one, *on_four]:
        assert result["step"] == 6
        np.testing.assert_array_equal(result["ids"], on_one["ids"])
        np.testing.assert_allclose(result["w1"], on_one["w1"], rtol=1e-5, atol=1e-7)
        for start, shard in result["labels"]:
            np.testing.assert_array_equal(shard, labels[start : start + len(shard)])


OWN_LOOP = """
import os, signal, sys
import jax
jax.config.update("jax_num_cpu_devices", 8)
import meshfeed, train_fns
mesh = meshfeed.make_mesh(data=8)
target = meshfeed.TrainState.create(train_fns.init_params(), train_fns.OPTIMIZER, mesh=mesh)
loader = train_fns.loader(mesh)
checkpoints = meshfeed.train.Checkpoints(sys.argv[1])
start = checkpoints.latest_step() or 0
state = checkpoints.restore(target, loader) if start else target
step = meshfeed.make_train_step(train_fns.loss_fn, train_fns.OPTIMIZER, mesh=mesh)
preemption = meshfeed.train.on_preemption()
for k, batch in zip(range(start + 1, 13), loader):
    state, metrics = step(state, batch)
    if k == 5 and start == 0:
        os.kill(os.getpid(), signal.SIGTERM)  # told: this step is the one to save
    if preemption.reached(k):
        checkpoints.save(k, state, loader)
        checkpoints.close()
        preemption.stop()
checkpoints.close()
print("from", start, "to", k, float(metrics["loss"]))
"""


def test_a_sigterm_in_a_loop_of_ones_own_saves_that_step_and_the_run_resumes(tmp_path):
    run = [sys.executable, "-c", OWN_LOOP, str(tmp_path / "run")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    told = subprocess.run(run, capture_output=True, text=True, env=env, timeout=120)
    assert told.returncode == 0, told.stderr[-3000:]
    assert told.stdout == ""  # stopped inside the loop
    line = "meshfeed: preempted: this process (of 1) was told to stop (SIGTERM); process 0 saved"
    assert f"{line} step 5 and stops here" in told.stderr, told.stderr[-3000:]
    again = subprocess.run(run, capture_output=True, text=True, env=env, timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    _, start, _, end, loss = again.stdout.split()
    assert (start, end) == ("5", "12")
    unbroken = train_fns.fit_losses(12)[-1]
    np.testing.assert_allclose(float(loss), unbroken, rtol=1e-5)


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
    with pytest.raises(ValueError, match=r"hdfs:// is not a place checkpoints go; pass a local"):
        meshfeed.save_checkpoint("hdfs://cluster/run", 1, {"x": np.zeros(2)})
    with pytest.raises(ValueError, match=r"max_to_keep=0 must be an int >= 1"):
        meshfeed.save_checkpoint(tmp_path / "run", 1, {"x": np.zeros(2)}, max_to_keep=0)


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
