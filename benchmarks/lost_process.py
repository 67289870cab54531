"""Workload L, a lost process: how soon the survivors end, and what they say.

Processes started as a cluster manager starts them (no ``meshfeed launch``) train the
demo's convnet with ``fit``; after step 12, process 1 is SIGKILLed (part ``kill``) or
SIGSTOPped (``stop``). meshfeed's watch (``meshfeed.initialize()``) against plain
``jax.distributed.initialize(heartbeat_timeout_seconds=20)``, rotating rounds: seconds
from the death to each survivor's exit, its exit code and last line. Part ``load``: how
late a 0.25 s timer thread wakes in 4 processes x 2 devices under two busy loops.
``--smoke`` (one round of ``kill``, a short ``load``) for CI.
"""

from __future__ import annotations

import argparse
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
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
        heartbeat_timeout_seconds=int(os.environ.get("BENCH_JAX_HEARTBEAT", "20")))
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
loader = meshfeed.Loader(meshfeed.ArraySource(digits()), global_batch_size=DIGITS_BATCH_SIZE,
    sharding=meshfeed.batch_sharding(mesh), num_epochs=None, seed=0)
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

meshfeed.fit(step, state, loader, num_steps=steps, progress=False,
             checkpoint_dir=out + ".ckpt", checkpoint_every=5)
print(f"late {late[0]:.4f}", flush=True)
"""


def _run(
    tmp: Path, how: str, action: str, processes: int, devices: int, steps: int, heartbeat: int
) -> dict:
    """One job; the survivors' seconds to exit after the death, codes and last lines.
    ``heartbeat``: plain JAX's heartbeat timeout, meshfeed's backstop."""
    coordinator = f"127.0.0.1:{free_port()}"
    out = tmp / f"{how}-{action}-{time.monotonic_ns()}"
    job = tmp / "job.py"
    job.write_text(JOB)
    started = []
    for i in range(processes):
        env = cluster_env(i, processes, devices, coordinator)
        env["BENCH_DIR"] = str(Path(__file__).resolve().parent)
        env["BENCH_JAX_HEARTBEAT"] = str(heartbeat)
        log = Path(f"{out}.{i}.log")
        with log.open("w") as f:
            cmd = [sys.executable, str(job), how, action, str(steps), "12", str(out)]
            started.append(
                (subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT), log)
            )
    ends: dict[int, float] = {}
    deadline = time.monotonic() + 300
    victim = 1 if action != "none" else None
    while len(ends) < processes - (victim is not None) and time.monotonic() < deadline:
        for i, (popen, _) in enumerate(started):
            if i != victim and i not in ends and popen.poll() is not None:
                ends[i] = time.monotonic()
        time.sleep(0.02)
    for popen, _ in started:
        if popen.poll() is None:
            popen.send_signal(signal.SIGKILL)
            popen.wait()
    died = float(Path(f"{out}.died").read_text()) if victim is not None else None
    survivors = []
    for i, (popen, log) in enumerate(started):
        if i == victim:
            continue
        lines = [line for line in log.read_text().splitlines() if line.strip()]
        survivors.append(
            {
                "process": i,
                "seconds_to_exit": None if died is None or i not in ends else ends[i] - died,
                "exit_code": popen.returncode,
                "last_line": lines[-1][:300] if lines else "",
                "late": next((float(x.split()[1]) for x in lines if x.startswith("late ")), None),
            }
        )
    return {"survivors": survivors}


def _emit(smoke: bool, **fields: Any) -> None:
    emit("lost_process", smoke=smoke, machine=platform.node(), devices=8, **fields)


def _deaths(tmp: Path, action: str, args: argparse.Namespace) -> None:
    heartbeat = 5 if args.smoke else 20  # the smoke checks the code runs: a shorter wait
    ratios = []
    for r in range(args.rounds):
        took = {}
        for how in ["meshfeed", "jax"] if r % 2 == 0 else ["jax", "meshfeed"]:
            result = _run(tmp, how, action, 2, 4, steps=30, heartbeat=heartbeat)
            for s in result["survivors"]:
                _emit(args.smoke, part=action, who=how, round=r, **s, processes=2)
            took[how] = max(s["seconds_to_exit"] or float("inf") for s in result["survivors"])
        ratios.append(took["meshfeed"] / took["jax"])
    _emit(
        args.smoke,
        part=action,
        summary="median survivor exit time, meshfeed / plain JAX",
        ratio=statistics.median(ratios),
        rounds=args.rounds,
        processes=2,
    )


def _load(tmp: Path, smoke: bool) -> None:
    steps = 15 if smoke else 300
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        result = _run(tmp, "meshfeed", "none", 4, 2, steps=steps, heartbeat=20)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    late = [s["late"] for s in result["survivors"] if s["late"] is not None]
    _emit(
        smoke,
        part="load",
        processes=4,
        steps=steps,
        busy_loops=2,
        longest_wake_delay_s=max(late) if late else None,
        exit_codes=[s["exit_code"] for s in result["survivors"]],
    )


def main() -> None:
    args = arguments(
        __doc__,
        rounds=3,
        smoke={"rounds": 1, "parts": "kill,load"},
        add=lambda p: p.add_argument("--parts", default="kill,stop,load"),
    )
    with tempfile.TemporaryDirectory(prefix="meshfeed-lost-") as tmp:
        for part in args.parts.split(","):
            if part in ("kill", "stop"):
                _deaths(Path(tmp), part, args)
            elif part == "load":
                _load(Path(tmp), args.smoke)
            else:
                raise SystemExit(f"unknown part {part!r}; pass kill, stop or load.")


if __name__ == "__main__":
    main()
