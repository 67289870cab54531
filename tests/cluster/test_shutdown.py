"""``meshfeed.shutdown()``: a process may leave with ``os._exit`` and not be reported lost."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from meshfeed.testing import cluster_env, free_port

JOB = Path(__file__).resolve().parents[1] / "helpers" / "shutdown_job.py"
LOST = "meshfeed: process"


def _run_job(tmp, *args, processes=2, devices=2, timeout=120):
    """Each process's (exit code, output), started as a cluster manager would."""
    coordinator = f"127.0.0.1:{free_port()}"
    started = []
    for i in range(processes):
        env = cluster_env(i, processes, devices, coordinator)
        log = (tmp / f"log_{i}.txt").open("w")
        cmd = [sys.executable, str(JOB), *args]
        started.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
        log.close()
    deadline = time.monotonic() + timeout
    for popen in started:
        try:
            popen.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()
    return [(p.returncode, (tmp / f"log_{i}.txt").read_text()) for i, p in enumerate(started)]


@pytest.mark.multiprocess
@pytest.mark.parametrize("leaver", [1, 0], ids=["process_1_leaves", "process_0_leaves"])
def test_after_shutdown_a_process_leaves_with_os_exit_and_its_peer_finishes(leaver, tmp_path):
    ends = _run_job(tmp_path, "--leaver", str(leaver), "--shutdown", "--stay", "2")
    for i, (code, log) in enumerate(ends):
        assert code == 0, log[-3000:]
        assert LOST not in log, log[-3000:]
        assert f"process {i}: the run's sum is 3" in log, log[-3000:]
        ending = "leaving with os._exit(0)" if i == leaver else "done"
        assert f"process {i}: {ending}" in log, log[-3000:]


@pytest.mark.multiprocess
def test_without_shutdown_os_exit_reads_as_lost_to_the_peer(tmp_path):
    """What the guide says happens to a script that ends with os._exit alone."""
    (code, log), (leaver_code, leaver_log) = _run_job(tmp_path, "--leaver", "1", "--stay", "2")
    assert leaver_code == 0, leaver_log[-3000:]
    assert code == 1, log[-3000:]
    assert "process 0: done" not in log
    line = "meshfeed: process 1 of 2 was lost (its connection closed: killed or crashed) while"
    assert line in log, log[-3000:]


@pytest.mark.multiprocess
def test_a_peer_lost_while_shutdown_waits_ends_the_process_with_the_watch_line(tmp_path):
    """shutdown() says goodbye after JAX's barrier, so the watch still runs while it waits."""
    flags = ["--leaver", "1", "--shutdown", "--stay", "2", "--die"]
    (peer_code, _), (code, log) = _run_job(tmp_path, *flags)
    assert peer_code == -9
    assert code == 1, log[-3000:]
    line = (
        "meshfeed: process 0 of 2 was lost (its connection closed: killed or crashed) while "
        "process 1 was in meshfeed.shutdown(), waiting for the other processes; exiting"
    )
    assert line in log, log[-3000:]
    assert "leaving with os._exit(0)" not in log


SINGLE = """
import jax, meshfeed
meshfeed.shutdown()  # nothing connected, no watch
meshfeed.initialize("127.0.0.1:{port}", num_processes=1, process_id=0)
meshfeed.shutdown()
meshfeed.shutdown()
print(jax.distributed.is_initialized())
"""


def test_shutdown_is_safe_on_one_process_and_twice():
    done = subprocess.run(
        [sys.executable, "-c", SINGLE.format(port=free_port())],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.strip() == "False", done.stdout + done.stderr[-2000:]
