"""A job killed mid-epoch and relaunched under `meshfeed launch` finishes the same run."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from train_fns import NUM_EXAMPLES, fit_with_checkpoints

pytestmark = pytest.mark.multiprocess

TRAIN = """
import json, os, signal, sys
helpers, out, run, kill_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
sys.path.insert(0, helpers)
import meshfeed
meshfeed.initialize()
import jax, numpy as np
import train_fns


class Logged(meshfeed.Loader):
    # Logs each consumed step's example ids; process 1 is killed at step kill_at.
    def __iter__(self):
        for batch in super().__iter__():
            step = self.step - 1
            if jax.process_index() == 0:
                with open(os.path.join(out, f"ids_{run}.log"), "a") as log:
                    log.write(json.dumps({"step": step, "ids": self.ids(step).tolist()}) + "\\n")
            if step == kill_at and jax.process_index() == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            yield batch


mesh = meshfeed.make_mesh(data=jax.device_count())
state = meshfeed.TrainState.create(train_fns.init_params(), train_fns.OPTIMIZER, mesh=mesh)
step = meshfeed.make_train_step(train_fns.loss_fn, train_fns.OPTIMIZER, mesh=mesh)
loader = Logged(train_fns.source(), global_batch_size=train_fns.GLOBAL_BATCH_SIZE,
                sharding=meshfeed.batch_sharding(mesh), last_batch="pad", num_epochs=None,
                seed=4)
history = meshfeed.fit(step, state, loader, num_steps=14, progress=False,
                       checkpoint_dir=os.path.join(out, "checkpoints"), checkpoint_every=3)
if jax.process_index() == 0:
    params = {n: np.asarray(v.addressable_shards[0].data) for n, v in history.state.params.items()}
    np.savez(os.path.join(out, "params.npz"), **params)
"""


def _launch(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "meshfeed", "launch", "-n", "2", "--devices-per-process", "4"]
    cmd += ["--", sys.executable, str(script), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def _log(path: Path) -> dict[int, list[int]]:
    return {(e := json.loads(line))["step"]: e["ids"] for line in path.read_text().splitlines()}


def test_a_killed_job_relaunched_sees_every_example_once_per_epoch(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAIN))
    helpers = str(Path(__file__).resolve().parents[1] / "helpers")
    killed = _launch(script, helpers, str(tmp_path), "1", "8")
    assert killed.returncode != 0, killed.stdout + killed.stderr
    assert not (tmp_path / "params.npz").exists()
    again = _launch(script, helpers, str(tmp_path), "2", "-1")
    assert again.returncode == 0, again.stdout + again.stderr

    first, second = _log(tmp_path / "ids_1.log"), _log(tmp_path / "ids_2.log")
    resumed = min(second)
    # The newest whole checkpoint before the kill at step 8 (every 3): 6, or 3 when 6 was
    # still being written in the background when process 1 died.
    assert resumed in (3, 6)
    # The first run got to the checkpoint it resumes from (process 0 logs what it takes:
    # it may be a step or two behind process 1 when that one dies at 8).
    assert max(first) >= resumed
    steps = {**{s: i for s, i in first.items() if s < resumed}, **second}
    assert sorted(steps) == list(range(14))
    for epoch in range(2):  # 7 steps an epoch (100 examples, batch 16, last padded)
        ids = [i for s in range(7 * epoch, 7 * epoch + 7) for i in steps[s] if i >= 0]
        assert sorted(ids) == list(range(NUM_EXAMPLES))

    # The uninterrupted run, on one process of the same 8 devices (no third real-process run).
    whole = fit_with_checkpoints(str(tmp_path / "whole"), 14, 100)
    got = np.load(tmp_path / "params.npz")
    for name, value in whole["params"].items():
        np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-7)
