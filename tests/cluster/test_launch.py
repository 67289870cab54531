"""`meshfeed launch`: real processes on 127.0.0.1, started the way a user would."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from sigint import with_sigint

pytestmark = pytest.mark.multiprocess

PSUM = """
import meshfeed
meshfeed.initialize()
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = meshfeed.make_mesh(data=jax.device_count())
local = np.full(jax.local_device_count(), float(jax.process_index() + 1), np.float32)
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("data")), local, (8,))
total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(x)
print("devices", jax.device_count(), "sum", float(total))
"""

FAIL = """
import meshfeed
meshfeed.initialize()
import jax, time
if jax.process_index() == 1:
    raise RuntimeError("process one gives up")
time.sleep(120)
"""

SLEEP = """
import os, sys, time
name = f"pid_{os.environ['MESHFEED_PROCESS_ID']}"
open(os.path.join(sys.argv[1], name), "w").write(str(os.getpid()))
time.sleep(120)
"""


def _launch(script, tmp_path, *args, **kwargs):
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(script))
    cmd = [
        sys.executable,
        "-m",
        "meshfeed",
        "launch",
        "-n",
        "2",
        "--devices-per-process",
        "4",
        "--",
        sys.executable,
        str(path),
        *args,
    ]
    return cmd


def test_two_processes_of_four_devices_run_a_psum_and_agree(tmp_path):
    run = subprocess.run(_launch(PSUM, tmp_path), capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    # (1 + 1 + 1 + 1) from process 0's devices + (2 + 2 + 2 + 2) from process 1's.
    assert "[0] devices 8 sum 12.0" in run.stdout
    assert "[1] devices 8 sum 12.0" in run.stdout


def test_a_child_that_raises_stops_the_launch_quickly_with_its_traceback(tmp_path):
    start = time.monotonic()
    run = subprocess.run(_launch(FAIL, tmp_path), capture_output=True, text=True, timeout=120)
    took = time.monotonic() - start
    assert run.returncode != 0
    assert "[1] Traceback" in run.stdout and "[1] RuntimeError: process one gives up" in run.stdout
    assert "process 1 exited with code 1; stopped the others" in run.stderr
    assert took < 10, took


def test_ctrl_c_stops_every_child(tmp_path):
    launcher = subprocess.Popen(
        with_sigint(_launch(SLEEP, tmp_path, str(tmp_path))),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("pid_*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = [int(p.read_text()) for p in tmp_path.glob("pid_*")]
    assert len(pids) == 2
    launcher.send_signal(signal.SIGINT)
    assert launcher.wait(timeout=10) == 130
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_launch_without_a_command_says_how():
    run = subprocess.run(
        [sys.executable, "-m", "meshfeed", "launch", "-n", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode != 0 and "launch needs the command after --" in run.stderr


# What gloo wrote on a process of 4 CPU devices, as read line by line (captured here):
# each device's thread writes its report piece by piece, so reports interleave.
GLOO_LINES = [
    "[Gloo] Rank 4 is connected to 7[Gloo] Rank 5 is connected to 7 peer ranks. "
    "Expected number of connected peer ranks is : 7\n",
    " peer ranks. [Gloo] Rank 6 is connected to 7 peer ranks. "
    "Expected number of connected peer ranks is : 7\n",
    "Expected number of connected peer ranks is : 7\n",
    "[Gloo] Rank [Gloo] Rank 5 is connected to 7 peer ranks. "
    "Expected number of connected peer ranks is : 7\n",
    "6 is connected to 7 peer ranks. Expected number of connected peer ranks is : 7\n",
    "[Gloo] Rank 6 is connected to 7 peer ranks. Expected number of connected peer ranks is"
    " : [Gloo] Rank 7 is connected to 7 peer ranks. Expected number of connected peer ranks"
    " is : 77\n",
    "\n",
]


def test_gloo_reports_are_told_from_the_program_output_even_interleaved():
    from meshfeed.cluster._launch import GlooFilter

    program = ["2 process(es), mesh {'data': 8}\n", "7\n", "\n", "step 20 loss 0.4\n"]
    lines = [program[0], *GLOO_LINES[:3], program[1], *GLOO_LINES[3:], program[2], program[3]]
    gloo = GlooFilter()
    assert [line for line in lines if not gloo.chatter(line)] == program
