"""Workload L, a lost process: how soon the survivors end and what they say, meshfeed's watch
against plain ``jax.distributed`` (parts ``kill`` and ``stop``), and how late a timer thread
wakes under load (``load``)."""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import arguments, emit

from meshfeed.testing import cluster_env, free_port

JOB = r"""
import os, signal, sys, threading, time
how, action, out = sys.argv[1], sys.argv[2], sys.argv[5]
steps, at = int(sys.argv[3]), int(sys.argv[4])
import jax
if how == "meshfeed":
    import meshfeed
    meshfeed.initialize()
else:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(os.environ["MESHFEED_COORDINATOR"],
        num_processes=int(os.environ["MESHFEED_NUM_PROCESSES"]),
        process_id=int(os.environ["MESHFEED_PROCESS_ID"]),
        heartbeat_timeout_seconds=int(sys.argv[6]))
    import meshfeed
sys.path.insert(0, os.environ["BENCH_DIR"])
import optax
from common import DIGITS_BATCH_SIZE, DIGITS_LEARNING_RATE, digits, digits_loss, digits_params

late = [0.0]
def wake():
    while True:
        t = time.monotonic(); time.sleep(0.25); late[0] = max(late[0], time.monotonic() - t - 0.25)
threading.Thread(target=wake, daemon=True).start()

mesh = meshfeed.make_mesh(data=jax.device_count())
sharding = meshfeed.batch_sharding(mesh)
optimizer = optax.adam(DIGITS_LEARNING_RATE)
state = meshfeed.TrainState.create(digits_params(), optimizer, mesh=mesh)
inner = meshfeed.make_train_step(digits_loss, optimizer, mesh=mesh)
victim = action != "none" and jax.process_index() == 1

def step(state, batch):
    number = int(state.step) + 1
    result = inner(state, batch)
    if victim and number == at:
        open(out + ".died", "w").write(str(time.monotonic()))
        os.kill(os.getpid(), signal.SIGKILL if action == "kill" else signal.SIGSTOP)
    return result

if how == "meshfeed":
    loader = meshfeed.Loader(meshfeed.ArraySource(digits()), global_batch_size=DIGITS_BATCH_SIZE,
        sharding=sharding, num_epochs=None, seed=0)
    meshfeed.fit(step, state, loader, num_steps=steps, progress=False,
                 checkpoint_dir=out + ".ckpt", checkpoint_every=5)
else:  # a plain loop: meshfeed's Loader and fit would watch the job
    import numpy as np
    data, local = digits(), DIGITS_BATCH_SIZE // jax.process_count()
    for s in range(steps):
        ids = np.random.default_rng(s).choice(len(data["label"]), DIGITS_BATCH_SIZE, replace=False)
        ids = ids[jax.process_index() * local:][:local]
        state, _ = step(state, {k: jax.make_array_from_process_local_data(sharding, v[ids])
                                for k, v in data.items()})
    jax.block_until_ready(state)
print(f"late {late[0]:.4f}", flush=True)
"""


def _run(
    tmp: Path, how: str, action: str, processes: int, devices: int, steps: int, heartbeat: int
) -> list[dict]:
    """One job (process 1 lost after step 12 unless ``action`` is ``none``): each survivor's
    seconds from the death to its exit, code and last line. ``heartbeat``: plain JAX's
    heartbeat timeout, meshfeed's backstop."""
    coordinator = f"127.0.0.1:{free_port()}"
    out = tmp / f"{how}-{action}-{time.monotonic_ns()}"
    command = [sys.executable, "-c", JOB, how, action, str(steps), "12", str(out), str(heartbeat)]
    bench = {"BENCH_DIR": str(Path(__file__).resolve().parent)}
    logs = [Path(f"{out}.{i}.log") for i in range(processes)]
    popens = []
    for i, log in enumerate(logs):
        env = {**cluster_env(i, processes, devices, coordinator), **bench}
        with log.open("w") as f:
            popens.append(subprocess.Popen(command, env=env, stdout=f, stderr=subprocess.STDOUT))
    victim = 1 if action != "none" else None
    survivors = [i for i in range(processes) if i != victim]
    ends: dict[int, float] = {}
    deadline = time.monotonic() + 300
    for i in survivors:  # one when a process is lost: its exit timed exactly
        with contextlib.suppress(subprocess.TimeoutExpired):
            popens[i].wait(timeout=max(0.0, deadline - time.monotonic()))
            ends[i] = time.monotonic()
    for popen in popens:  # the stopped process, and any left after the deadline
        popen.kill()
        popen.wait()
    died = float(Path(f"{out}.died").read_text()) if victim is not None else None
    result = []
    for i in survivors:
        lines = [line for line in logs[i].read_text().splitlines() if line.strip()]
        seconds = None if died is None or i not in ends else ends[i] - died
        got = {"process": i, "seconds_to_exit": seconds, "exit_code": popens[i].returncode}
        got["last_line"] = lines[-1][:300] if lines else ""
        got["late"] = next((float(x.split()[1]) for x in lines if x.startswith("late ")), None)
        result.append(got)
    return result


def _emit(smoke: bool, **fields: Any) -> None:
    emit("lost_process", smoke=smoke, machine=platform.node(), devices=8, **fields)


def _deaths(tmp: Path, action: str, args: argparse.Namespace) -> None:
    heartbeat = 5 if args.smoke else 20  # the smoke checks the code runs: a shorter wait
    ratios = []
    for r in range(args.rounds):
        took = {}
        for how in ["meshfeed", "jax"] if r % 2 == 0 else ["jax", "meshfeed"]:
            survivors = _run(tmp, how, action, 2, 4, steps=30, heartbeat=heartbeat)
            for s in survivors:
                _emit(args.smoke, part=action, who=how, round=r, **s, processes=2)
            took[how] = max(s["seconds_to_exit"] or float("inf") for s in survivors)
        ratios.append(took["meshfeed"] / took["jax"])
    summary = "median survivor exit time, meshfeed / plain JAX"
    ratio = statistics.median(ratios)
    _emit(args.smoke, part=action, summary=summary, ratio=ratio, rounds=args.rounds, processes=2)


def _load(tmp: Path, smoke: bool) -> None:
    """How late a 0.25 s timer thread wakes in 4 processes x 2 devices under two busy loops."""
    steps = 15 if smoke else 300
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        survivors = _run(tmp, "meshfeed", "none", 4, 2, steps=steps, heartbeat=20)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    late = [s["late"] for s in survivors if s["late"] is not None]
    line: dict[str, Any] = {"processes": 4, "steps": steps, "busy_loops": 2}
    line["longest_wake_delay_s"] = max(late) if late else None
    line["exit_codes"] = [s["exit_code"] for s in survivors]
    _emit(smoke, part="load", **line)


def main() -> None:
    args = arguments(__doc__, rounds=3)
    with tempfile.TemporaryDirectory(prefix="meshfeed-lost-") as tmp:
        for action in ("kill",) if args.smoke else ("kill", "stop"):
            _deaths(Path(tmp), action, args)
        _load(Path(tmp), args.smoke)


if __name__ == "__main__":
    main()
