"""fit's parts, each on its own: the input clock, the saves, the evaluations, the log
steps and the progress lines. ``test_train.py``, ``test_checkpoint.py``, ``test_kill.py``
and ``test_writers.py`` hold the loop they make together."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meshfeed
import train_fns
from meshfeed.train._evaluate import Evaluations, evaluator
from meshfeed.train._fit_checkpoints import FitCheckpoints
from meshfeed.train._fit_log import FitLog
from meshfeed.train._fit_progress import FitProgress
from meshfeed.train._input_clock import InputClock, endless


def _mesh():
    return meshfeed.make_mesh(data=jax.device_count())


def _slow(batches, seconds):
    for batch in batches:
        time.sleep(seconds)
        yield batch


@jax.jit
def _busy(state, batch):
    """A step that keeps the devices busy for a while (repeated matrix products)."""
    a = jnp.full((256, 256), 1e-3, jnp.float32)

    def body(_, x):
        return jnp.tanh(x @ a)

    out = jax.lax.fori_loop(0, 200, body, a + state)
    return state + out[0, 0], {"loss": out[0, 0] + batch["x"].sum()}


def _batches(count, rows=8):
    return [{"x": jnp.ones((rows, 2), jnp.float32)} for _ in range(count)]


def test_the_clock_counts_a_wait_only_while_the_devices_are_idle():
    clock = InputClock()
    batches = iter(_slow(_batches(3), 0.05))
    state = jnp.zeros(())
    for _ in range(3):
        batch = clock.next(batches)
        state, _ = clock.dispatch(lambda s, b: (s + 1, {"loss": s}), state, batch)
        jax.block_until_ready(state)  # the devices idle before each next batch
    assert clock.rows == 24
    assert clock.in_loader >= 0.15
    assert clock.wait == pytest.approx(clock.in_loader)  # every read kept them waiting

    busy = InputClock()
    batches = iter(_slow(_batches(2), 0.05))
    state, _ = busy.dispatch(_busy, jnp.zeros(()), busy.next(batches))  # compiled once
    jax.block_until_ready(state)
    busy = InputClock()
    batches = iter(_slow(_batches(2), 0.05))
    state, _ = busy.dispatch(_busy, state, busy.next(batches))
    waited_first = busy.wait
    busy.next(batches)  # read while that step computes: overlapped, not waited
    assert busy.in_loader >= 0.1
    assert busy.wait == pytest.approx(waited_first)
    jax.block_until_ready(state)


def test_the_clock_keeps_at_most_two_steps_on_the_devices():
    clock = InputClock()
    state = jnp.zeros(())
    jax.block_until_ready(_busy(state, _batches(1)[0]))  # compiled
    outputs = []
    for batch in _batches(3):
        state, metrics = clock.dispatch(_busy, state, batch)
        outputs.append(metrics["loss"])
    assert outputs[0].is_ready()  # the third step waited for the first
    jax.block_until_ready(state)


def test_the_clock_shares_of_no_time_are_zero():
    assert InputClock().shares(0.0) == {
        "samples_per_s": 0.0,
        "input_wait_share": 0.0,
        "loader_share": 0.0,
    }


def test_a_loader_runs_into_its_next_pass_and_a_list_ends():
    loader = meshfeed.Loader(
        train_fns.source(),
        global_batch_size=train_fns.GLOBAL_BATCH_SIZE,
        sharding=meshfeed.batch_sharding(_mesh()),
        num_epochs=1,
    )
    steps = len(loader)
    batches = endless(loader)
    seen = [next(batches) for _ in range(steps + 2)]
    assert loader.step == steps + 2
    assert len(seen) == steps + 2
    listed = _batches(2)
    assert list(endless(listed)) == listed


def test_without_a_directory_the_saves_do_nothing():
    saves = FitCheckpoints(None, None)
    assert not saves.active
    state = {"w": np.ones(2)}
    assert saves.resume(state, train_fns.loader(_mesh())) == (state, 0)
    saves.catch_preemption()
    saves.save_if_due(1, 1, state, train_fns.loader(_mesh()))
    saves.stop_if_preempted(1, state, train_fns.loader(_mesh()))
    saves.close()


def test_the_saves_keep_every_nth_step_and_the_last_and_resume_from_the_newest(tmp_path):
    mesh = _mesh()
    state = meshfeed.TrainState.create(train_fns.init_params(), train_fns.OPTIMIZER, mesh=mesh)
    loader = train_fns.loader(mesh)
    saves = FitCheckpoints(tmp_path, every=3)
    assert saves.resume(state, loader) == (state, 0)
    batches = iter(loader)
    for k in range(1, 8):
        next(batches)
        saves.save_if_due(k, 7, state, loader)
    saves.close()
    assert sorted(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit()) == [3, 6, 7]
    again = train_fns.loader(mesh)
    restored, done = FitCheckpoints(tmp_path, every=3).resume(state, again)
    assert done == 7
    assert again.step == 7
    np.testing.assert_allclose(restored.params["w1"], state.params["w1"])


PREEMPTED = """
import os, signal, sys
import jax, numpy as np
import meshfeed, train_fns
from meshfeed.train._fit_checkpoints import FitCheckpoints

mesh = meshfeed.make_mesh(data=jax.device_count())
state = meshfeed.TrainState.create(train_fns.init_params(), train_fns.OPTIMIZER, mesh=mesh)
loader = train_fns.loader(mesh)
saves = FitCheckpoints({directory!r}, every=100)
saves.catch_preemption()
batches = iter(loader)
for k in range(1, 10):
    next(batches)
    if k == 4:
        os.kill(os.getpid(), signal.SIGTERM)  # the notice, caught
    saves.save_if_due(k, 9, state, loader)
    saves.stop_if_preempted(k, state, loader)
print("not stopped")
"""


def test_a_preemption_notice_saves_the_step_and_ends_the_process(tmp_path):
    script = PREEMPTED.format(directory=str(tmp_path / "run"))  # helpers on PYTHONPATH
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "not stopped" not in done.stdout
    assert "was told to stop (SIGTERM); process 0 saved step 4" in done.stderr
    assert sorted(p.name for p in (tmp_path / "run").iterdir() if p.name.isdigit()) == ["4"]


def test_evaluations_are_due_every_nth_step_and_at_the_last():
    evaluations = Evaluations(train_fns.eval_fn, [], every=3, last=7)
    assert [k for k in range(1, 8) if evaluations.due(k)] == [3, 6, 7]
    assert not any(Evaluations(None, None, every=1, last=7).due(k) for k in range(1, 8))


def test_an_evaluation_is_the_mean_over_every_valid_row():
    mesh = _mesh()
    state = meshfeed.TrainState.create(train_fns.init_params(), train_fns.OPTIMIZER, mesh=mesh)
    batches = meshfeed.Loader(
        train_fns.source(),
        global_batch_size=train_fns.GLOBAL_BATCH_SIZE,
        sharding=meshfeed.batch_sharding(mesh),
        last_batch="pad",  # 100 rows in batches of 16: the last holds 4
        shuffle=False,
    )
    params = {n: np.asarray(v) for n, v in state.params.items()}
    data = train_fns.source()[np.arange(len(train_fns.source()))]
    _, correct = train_fns.per_row_loss(params, data)
    result = evaluator(train_fns.eval_fn)(state, batches)
    assert result["accuracy"] == pytest.approx(float(np.mean(correct)), abs=1e-6)
    again = Evaluations(train_fns.eval_fn, batches, every=1, last=1).run(5, state)
    assert again == {"step": 5.0, **result}  # a Loader starts over each time


class Scalars:
    """A CLU-style writer that keeps what it is given."""

    def __init__(self):
        self.written = []

    def write_scalars(self, step, scalars):
        self.written.append((step, dict(scalars)))


def test_a_log_step_holds_the_step_its_input_and_the_loader_and_is_written():
    clock = InputClock()
    clock.rows = 160
    clock.wait = 0.0
    writer = Scalars()
    with FitLog(None, writer) as log:
        logged, info = log.figures(10, {"loss": jnp.asarray(0.5)}, clock)
        log.evaluated(10, {"step": 10.0, "accuracy": 0.75})
    log.close()
    assert list(logged) == ["step", "loss", "samples_per_s", "input_wait_share"]
    assert logged["step"] == 10.0
    assert logged["loss"] == 0.5
    assert logged["input_wait_share"] == 0.0
    assert info.startswith("loss 0.5000  ") and "input wait 0.0%" in info
    assert writer.written[0][0] == 10
    assert set(writer.written[0][1]) == {"train/loss", "input/records_per_s", "input/wait_share"}
    assert writer.written[1] == (10, {"eval/accuracy": 0.75})

    loader = train_fns.loader(_mesh())
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    with FitLog(loader, None) as log:
        logged, info = log.figures(3, {"loss": jnp.asarray(0.5)}, clock)
    assert logged["batch_size"] == float(train_fns.GLOBAL_BATCH_SIZE)
    assert "prefetch_depth" in logged
    assert "read-ahead" in info


class Failing:
    def write_scalars(self, step, scalars):
        raise OSError("the disk is full")


def _writers_alive():
    return sum(t.name == "meshfeed-writer" for t in threading.enumerate())


def test_a_run_that_raises_ends_the_writers_thread():
    clock = InputClock()
    before = _writers_alive()
    with pytest.raises(KeyError), FitLog(None, Scalars()):
        assert _writers_alive() == before + 1
        raise KeyError("the step failed")
    assert _writers_alive() == before
    with pytest.raises(RuntimeError, match="the writer failed"), FitLog(None, Failing()) as log:
        log.figures(1, {"loss": jnp.asarray(1.0)}, clock)
        log.close()  # raises what the thread met


def test_progress_off_a_terminal_is_a_line_per_log_and_per_evaluation(capsys):
    with FitProgress("train", total=10, done=0, show=True) as shown:
        shown.stepped(1)
        shown.logged(5, "loss 0.5000")
        shown.evaluated(5, {"step": 5.0, "accuracy": 0.75})
    out = capsys.readouterr().out
    assert out.splitlines() == ["train: step 5/10  loss 0.5000", "eval at step 5: accuracy 0.7500"]
    with FitProgress("train", total=10, done=0, show=False) as shown:
        shown.logged(5, "loss 0.5000")
        shown.evaluated(5, {"step": 5.0, "accuracy": 0.75})
    assert capsys.readouterr().out == ""


def test_the_parts_are_small():
    """Every function of fit and its parts stays under ~60 lines of code (docstring aside)."""
    import ast
    import inspect

    from meshfeed.train import (
        _evaluate,
        _fit,
        _fit_checkpoints,
        _fit_log,
        _fit_progress,
        _input_clock,
    )

    for module in (_evaluate, _fit, _fit_checkpoints, _fit_log, _fit_progress, _input_clock):
        tree = ast.parse(inspect.getsource(module))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                body = node.body[1:] if ast.get_docstring(node) else node.body
                size = body[-1].end_lineno - body[0].lineno + 1  # type: ignore[operator]
                assert size <= 60, f"{module.__name__}.{node.name}: {size} lines"
