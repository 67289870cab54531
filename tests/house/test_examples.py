"""Every example in examples/ runs and prints what its docstring says it prints."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SINGLE = [
    "pmap_data_parallel",
    "three_ways",
    "matmul",
    "keras_multi_device",
    "four_strategies",
]


def _promised(name: str) -> list[str]:
    doc = ast.get_docstring(ast.parse((EXAMPLES / f"{name}.py").read_text())) or ""
    block = doc.split("::\n", 1)[1]
    return [line[4:].rstrip() for line in block.splitlines() if line.strip()]


def _printed(stdout: str) -> list[str]:
    return [line.rstrip() for line in stdout.splitlines() if line.strip()]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return {**env, "JAX_PLATFORMS": "cpu", "KERAS_BACKEND": "jax"}


@pytest.mark.parametrize("name", SINGLE)
def test_example_prints_its_docstring(name):
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py")],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
    )
    assert run.returncode == 0, run.stderr
    assert _printed(run.stdout) == _promised(name)


@pytest.mark.multiprocess
def test_multi_process_example_under_launch():
    cmd = [sys.executable, "-m", "meshfeed", "launch", "-n", "2", "--devices-per-process", "4"]
    cmd += ["--", sys.executable, str(EXAMPLES / "multi_process.py")]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env())
    assert run.returncode == 0, run.stdout + run.stderr
    # gloo prints connection notes of its own, interleaved: keep the example's lines.
    noise = ("Gloo", "peer ranks")
    ours = [
        line
        for line in _printed(run.stdout)
        if line[4:].strip() and not any(n in line for n in noise)
    ]
    assert ours == _promised("multi_process")


@pytest.mark.multiprocess
def test_text_to_a_trained_model_in_three_commands(tmp_path):
    """lm_corpus.py, meshfeed prepare, lm_train.py under launch: the commands of their
    docstrings (the docs guide "From text to batches"), on a small corpus."""
    folder = tmp_path / "lm"
    steps = [
        [sys.executable, str(EXAMPLES / "lm_corpus.py"), str(folder), "--max-mb", "0.5",
         "--vocab", "512"],
        [sys.executable, "-m", "meshfeed", "prepare", str(folder / "corpus" / "*.jsonl"),
         "--tokenizer", str(folder / "tokenizer.json"), "--out", str(folder / "tokens"),
         "--workers", "2"],
        [sys.executable, "-m", "meshfeed", "launch", "-n", "2", "--devices-per-process", "4",
         "--", sys.executable, str(EXAMPLES / "lm_train.py"), str(folder), "--steps", "12",
         "--seq-len", "128", "--batch", "16"],
    ]  # fmt: skip
    out = []
    for command in steps:
        run = subprocess.run(command, capture_output=True, text=True, timeout=300, env=_env())
        assert run.returncode == 0, run.stdout + run.stderr
        out.append(run.stdout)
    assert "tokenizer: byte-level BPE, 512 tokens" in out[0]
    assert "parts written (complete)" in out[1]
    assert "rows of 128 tokens" in out[2] and "mesh {'data': 4, 'model': 2}" in out[2]
    first, last = (
        float(x) for x in re.findall(r"loss ([\d.]+) bits .*, ([\d.]+) after", out[2])[0]
    )
    assert last < first


@pytest.mark.multiprocess
def test_long_context_resumes_on_another_number_of_processes(tmp_path):
    """long_context.py as its docstring runs it: 2 processes x 4 devices save half-way,
    1 process x 8 devices resumes there; process 0 prints the lines promised."""
    script = str(EXAMPLES / "long_context.py")
    launch = [sys.executable, "-m", "meshfeed", "launch", "-n", "2", "--devices-per-process", "4"]
    runs = [
        [*launch, "--", sys.executable, script, "--checkpoint", str(tmp_path)],
        [sys.executable, script, "--resume", str(tmp_path)],
    ]
    noise = ("Gloo", "peer ranks")  # gloo's connection notes, interleaved
    printed = []
    for command in runs:
        run = subprocess.run(command, capture_output=True, text=True, timeout=300, env=_env())
        assert run.returncode == 0, run.stdout + run.stderr
        printed += [line for line in _printed(run.stdout) if not any(n in line for n in noise)]
    assert printed == _promised("long_context")


def test_every_example_is_tested():
    # train.py is run alone and under launch in test_first_hour.py
    assert sorted(p.stem for p in EXAMPLES.glob("*.py")) == sorted(
        [*SINGLE, "multi_process", "train", "lm_corpus", "lm_train", "long_context"]
    )
