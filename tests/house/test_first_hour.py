"""The first hour of a new user, item by item: each stumble once found, now fixed."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import meshfeed

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _one_device_env() -> dict[str, str]:
    """A plain machine: one CPU device, no launcher, no cluster."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS" and not k.startswith("MESHFEED")}
    return {**env, "JAX_PLATFORMS": "cpu", "KERAS_BACKEND": "jax"}


def _meshfeed(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "meshfeed", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env or _one_device_env(),
    )


def _python(code: str) -> subprocess.CompletedProcess:
    """``python -c code`` on a plain machine (one CPU device, no launcher)."""
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=_one_device_env(),
    )


def test_initialize_alone_is_one_process_without_error():
    run = _python("import meshfeed; meshfeed.initialize(); import jax; print(jax.process_count())")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "1"


def test_train_py_runs_alone_on_one_device():
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / "train.py"), "--epochs", "5"],
        capture_output=True,
        text=True,
        timeout=300,
        env=_one_device_env(),
    )
    assert run.returncode == 0, run.stderr
    assert "1 process(es), mesh {'data': 1}, batch 64" in run.stdout
    accuracy = float(run.stdout.strip().splitlines()[-1].rsplit(" ", 1)[1])
    assert accuracy > 0.85


@pytest.mark.multiprocess
def test_train_py_under_launch_keeps_gloo_out_of_the_output():
    run = _meshfeed(
        *("launch", "-n", "2", "--devices-per-process", "4", "--"),
        *(sys.executable, str(EXAMPLES / "train.py"), "--epochs", "5"),
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "[0] 2 process(es), mesh {'data': 8}, batch 64" in run.stdout
    assert "[0] test accuracy after 5 epochs" in run.stdout
    assert "Gloo" not in run.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("show", "--mesh", "data=4,model=2", "--spec", "data", "--shape", "250,784"),
            "dimension 0 of --shape is 250, which does not split into 4 equal blocks",
        ),
        (
            ("show", "--mesh", "data=3,model=2", "--spec", "data,model", "--shape", "256,784"),
            "dimension 0 of --shape is 256, which does not split into 3 equal blocks",
        ),
        (
            ("show", "--mesh", "data=4,model=2", "--spec", "data,model,data", "--shape", "8,8,8"),
            "--spec uses mesh axis 'data' on two dimensions",
        ),
        (
            ("plan", "--mesh", "data=4,model=2", "--spec", "data", "--processes", "3"),
            "--processes 3 must divide the 8 devices",
        ),
        (
            ("bench", "loader", "--mesh", "data=3", "--batch", "256"),
            "--batch 256 does not split over data=3",
        ),
        (("demo", "--processes", "3"), "the demo splits its batch of 64 rows over all devices"),
        (("launch", "-n", "2"), "launch needs the command after --"),
    ],
)
def test_cli_mistakes_are_one_line_and_exit_2(args, message):
    run = _meshfeed(*args)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("meshfeed: error: "), run.stderr
    assert message in lines[0]
    assert "Traceback" not in run.stderr


def test_bench_matmul_says_what_it_times_and_reports_progress():
    run = _meshfeed("bench", "matmul", "--size", "64", "--mesh", "data=2,model=2", "--repeats", "1")
    assert run.returncode == 0, run.stderr
    assert run.stderr.startswith("timing a 64 x 64 float32 matmul")
    assert "[1/7] one device" in run.stderr and "[7/7] auto" in run.stderr
    assert "┌" not in run.stdout  # the layouts only with --layouts
    assert "TFLOP/s" in run.stdout


def test_show_sharding_prints_and_returns_the_text(capsys):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    sharding = NamedSharding(meshfeed.make_mesh(data=8), P("data"))
    text = meshfeed.show_sharding(sharding, shape=(16,))
    assert capsys.readouterr().out == text
    meshfeed.show_sharding(sharding, shape=(16,), quiet=True)
    assert capsys.readouterr().out == ""


def test_fit_draws_a_bar_on_a_terminal_and_lines_off_one():
    script = (
        "import numpy as np, optax, meshfeed\n"
        "mesh = meshfeed.make_mesh(data=1)\n"
        "src = meshfeed.ArraySource({'x': np.ones((64, 2), np.float32)})\n"
        "sharding = meshfeed.batch_sharding(mesh)\n"
        "loader = meshfeed.Loader(src, global_batch_size=8, sharding=sharding, num_epochs=5)\n"
        "opt = optax.sgd(0.1)\n"
        "state = meshfeed.TrainState.create({'w': np.zeros(2, np.float32)}, opt, mesh=mesh)\n"
        "loss = lambda p, b: (((b['x'] @ p['w']) - 1.0) ** 2).mean()\n"
        "step = meshfeed.make_train_step(lambda p, b: (loss(p, b), {}), opt, mesh=mesh)\n"
        "meshfeed.fit(step, state, loader, log_every=10)\n"
    )
    argv = [sys.executable, "-c", script]
    piped = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=_one_device_env())
    assert piped.returncode == 0, piped.stderr
    assert "train: step 10/40" in piped.stdout and "━" not in piped.stdout
    master, terminal = pty.openpty()
    env = {**_one_device_env(), "COLUMNS": "120", "TERM": "xterm"}
    child = subprocess.Popen(argv, stdout=terminal, stderr=terminal, env=env)
    os.close(terminal)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert child.wait(timeout=120) == 0, out.decode(errors="replace")
    text = out.decode(errors="replace")
    assert "━" in text and "40/40" in text
    assert "train: step 10/40" not in text


def test_a_hugging_face_dataset_made_from_numpy_has_fixed_shapes():
    import datasets

    x = np.random.default_rng(0).normal(size=(1000, 6)).astype(np.float32)
    dataset = datasets.Dataset.from_dict({"x": x, "y": np.arange(1000)})
    source = meshfeed.sources.HFSource(dataset)
    assert source.fields["x"] == meshfeed.sources.FieldSpec((6,), np.dtype(np.float32))
    got = source[np.array([999, 0, 5])]
    np.testing.assert_array_equal(got["x"], x[[999, 0, 5]])
    loader = meshfeed.Loader(
        source, global_batch_size=8, sharding=meshfeed.batch_sharding(meshfeed.make_mesh(data=8))
    )
    assert next(iter(loader))["x"].shape == (8, 6)
    ragged = datasets.Dataset.from_dict({"t": [[1, 2], [3]]})
    assert meshfeed.sources.HFSource(ragged).fields["t"].ragged


def test_a_parquet_list_column_of_one_length_has_a_fixed_shape(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    x = np.arange(60, dtype=np.float32).reshape(20, 3)
    column = pa.array(list(x), type=pa.list_(pa.float32()))
    pq.write_table(pa.table({"x": column}), tmp_path / "t.parquet", row_group_size=7)
    source = meshfeed.sources.ParquetSource(str(tmp_path / "t.parquet"))
    assert source.fields["x"] == meshfeed.sources.FieldSpec((3,), np.dtype(np.float32))
    np.testing.assert_array_equal(source[np.array([19, 0, 8])]["x"], x[[19, 0, 8]])
    uneven = pa.array([[1.0, 2.0], [3.0]], type=pa.list_(pa.float32()))
    pq.write_table(pa.table({"x": uneven}), tmp_path / "u.parquet")
    assert meshfeed.sources.ParquetSource(str(tmp_path / "u.parquet")).fields["x"].ragged


def test_keras_fit_with_more_epochs_than_the_loader_holds_is_refused_first():
    import keras_fns

    mesh = meshfeed.make_mesh(data=8)
    loader = meshfeed.Loader(
        meshfeed.ArraySource(keras_fns.data()),
        global_batch_size=32,
        sharding=meshfeed.batch_sharding(mesh),
        num_epochs=1,
    )
    with pytest.raises(
        ValueError, match=r"fit\(epochs=2\) needs 2 x 8 steps, but the loader has 8"
    ):
        keras_fns.fit(mesh, keras_fns.model(), loader, epochs=2, progress=False)
    assert loader.step == 0  # refused before training


def test_demo_keras_without_keras_says_how_to_install_it():
    code = (
        "import sys; sys.modules['keras'] = None  # as if keras were not installed\n"
        "from meshfeed._cli import main\n"
        "sys.exit(main(['demo', '--keras']))\n"
    )
    run = _python(code)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install -e '.[keras]'" in lines[0], run.stderr
