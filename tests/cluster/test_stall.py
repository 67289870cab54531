"""A process alive but stuck is named on every process, with what it waits on.

Two real JAX processes (``meshfeed.initialize``, CPU devices, gloo) read a folder on the
local S3 server; process 1 through a ``CountingProxy`` that holds every range read,
process 0 through one that holds none. Also ``Stalls``' rules, fed progress by hand.
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import meshfeed
from meshfeed.cluster._stall import Stalls
from meshfeed.testing import CountingProxy, cluster_env, free_port

JOB = Path(__file__).resolve().parents[1] / "helpers" / "stall_job.py"
STALL_S = 3.0


def _progress(step, step_s, wait=None, host="h"):
    return json.dumps(
        {"host": host, "step": step, "step_s": step_s, "doing": f"at {step}", "wait": wait}
    )


def test_a_long_wait_and_a_process_behind_are_each_named_once():
    stalls = Stalls(3, stall_s=10.0)
    stalls.heard(0, _progress(7, 2.0))
    stalls.heard(1, _progress(7, 2.0, ["reading", "s3://b/x.npy", 9.0]))
    assert stalls.found() == []  # nothing has waited 10 s
    stalls.heard(1, _progress(7, 12.0, ["reading", "s3://b/x.npy", 11.0], host="h1"))
    [(who, reason)] = stalls.found()
    assert who == 1 and "waited 11 s on reading s3://b/x.npy" in reason and "host h1" in reason
    assert stalls.found() == []  # named once
    stalls.heard(0, _progress(8, 12.0))  # step 8 unfinished for 12 s on process 0 ...
    stalls.heard(2, _progress(6, 30.0, ["reading", "s3://b/y.npy", 3.0], host="h2"))
    found = dict(stalls.found())
    assert set(found) == {1, 2}  # ... and processes 1 and 2 are behind it
    assert "at step 6 (host h2), waiting 3 s on reading s3://b/y.npy" in found[2]
    assert "at step 7" in found[1]
    starting = Stalls(2, stall_s=10.0)  # a process that never got its first batch
    starting.heard(0, _progress(0, 12.0))
    starting.heard(1, _progress(None, 12.0, ["reading", "s3://b/meshfeed.json", 12.0]))
    behind = [reason for _, reason in starting.found() if "behind" in reason]
    assert behind and "this one has no step yet (host h), waiting 12 s on reading" in behind[0]


@pytest.mark.parametrize("on_stall", ["log", "raise"])
def test_a_stalled_process_is_named_on_every_process(server, tmp_path, on_stall):
    url = f"s3://data/stall-{on_stall}"
    data = {"y": np.arange(256, dtype=np.int32)}
    meshfeed.write_source(url, data, shard_size=32, storage_options=server.storage_options)
    clean, held = CountingProxy(server.port), CountingProxy(server.port)
    held.hold("range", 1.0, 60.0)  # every range read of process 1 answers in 60 s
    coordinator = f"127.0.0.1:{free_port()}"
    started = []
    try:
        for i in range(2):
            cmd = [
                sys.executable, str(JOB), "--url", url,
                "--options", json.dumps(server.storage_options),
                "--clean", clean.endpoint, "--held", held.endpoint,
                "--stall-s", str(STALL_S), "--on-stall", on_stall,
            ]  # fmt: skip
            log = tmp_path / f"log_{i}.txt"
            with log.open("w") as out:
                popen = subprocess.Popen(
                    cmd, env=cluster_env(i, 2, 2, coordinator), stdout=out, stderr=subprocess.STDOUT
                )
            started.append((popen, log))
        deadline = time.monotonic() + 120
        while held.held == 0 and time.monotonic() < deadline:  # process 1's first read
            time.sleep(0.05)
        assert held.held > 0, [log.read_text()[-2000:] for _, log in started]
        deadline = time.monotonic() + STALL_S + 10

        # Named either way: stalled on its read, or behind a step that waits on it.
        def named(text: str) -> list[str]:
            return [
                line for line in text.splitlines()
                if "meshfeed: process 1 of 2 " in line and f"on reading {url}/" in line
            ]  # fmt: skip

        texts: list[str] = []
        while time.monotonic() < deadline:
            texts = [log.read_text() for _, log in started]
            if all(named(t) for t in texts):
                break
            time.sleep(0.1)
        assert texts and all(named(t) for t in texts), [t[-2000:] for t in texts]
        for text in texts:
            line = named(text)[0]
            assert "host " in line, line
            print(line)  # pytest -s shows each process's line
        if on_stall == "raise":
            for popen, log in started:
                assert popen.wait(timeout=30) == 1, log.read_text()[-2000:]
                assert "exiting with code 1" in log.read_text()
    finally:
        for popen, _ in started:
            if popen.poll() is None:
                popen.kill()
                popen.wait()
        clean.close()
        held.close()
