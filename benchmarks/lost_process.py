"""Workload L, a lost process: how soon the survivors end, and what they say.

Processes are started as a cluster manager starts them (coordinator, count and id in
the environment; no ``meshfeed launch`` to stop the others), and train the demo's
convnet on the digits with ``fit``, a checkpoint every 5 steps. Right after dispatching
step 12, process 1 is SIGKILLed (part ``kill``) or SIGSTOPped (part ``stop``). Each round
runs meshfeed (``meshfeed.initialize()``: the watch, default ``heartbeat_timeout``) and
the peer, plain ``jax.distributed.initialize(heartbeat_timeout_seconds=20)`` -- what
meshfeed hands JAX as its backstop -- in rotating order, and measures the seconds from
the death to each survivor's exit, its exit code and its last line. Part ``load``: how
late a thread that wakes every 0.25 s (as the watch's does) wakes, at most, in each of
4 processes x 2 devices training 300 steps while two busy loops hold the 2 cores: the
margin ``heartbeat_timeout`` must cover. One JSON line per measurement; ``--smoke`` for
CI (one round of ``kill``, a short ``load``).
"""

from __future__ import annotations

import argparse
import json
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


_JAX_HEARTBEAT = 20  # plain JAX's heartbeat timeout: meshfeed's backstop (5 in --smoke)


def _run(tmp: Path, how: str, action: str, processes: int, devices: int, steps: int) -> dict:
    """One job; the survivors' seconds to exit after the death, codes and last lines."""
    coordinator = f"127.0.0.1:{free_port()}"
    out = tmp / f"{how}-{action}-{time.monotonic_ns()}"
    job = tmp / "job.py"
    job.write_text(JOB)
    started = []
    for i in range(processes):
        env = cluster_env(i, processes, devices, coordinator)
        env["BENCH_DIR"] = str(Path(__file__).resolve().parent)
        env["BENCH_JAX_HEARTBEAT"] = str(_JAX_HEARTBEAT)
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


def _emit(record: dict) -> None:
    print(json.dumps({"benchmark": "lost_process", "machine": platform.node(), **record}))


def _deaths(tmp: Path, action: str, rounds: int) -> None:
    ratios = []
    for r in range(rounds):
        order = ["meshfeed", "jax"] if r % 2 == 0 else ["jax", "meshfeed"]
        took = {}
        for how in order:
            result = _run(tmp, how, action, processes=2, devices=4, steps=30)
            for s in result["survivors"]:
                _emit({"part": action, "who": how, "round": r, **s})
            took[how] = max(s["seconds_to_exit"] or float("inf") for s in result["survivors"])
        ratios.append(took["meshfeed"] / took["jax"])
    _emit(
        {
            "part": action,
            "summary": "median survivor exit time, meshfeed / plain JAX",
            "ratio": statistics.median(ratios),
            "rounds": rounds,
        }
    )


def _load(tmp: Path, steps: int) -> None:
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        result = _run(tmp, "meshfeed", "none", processes=4, devices=2, steps=steps)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    late = [s["late"] for s in result["survivors"] if s["late"] is not None]
    _emit(
        {
            "part": "load",
            "processes": 4,
            "steps": steps,
            "busy_loops": 2,
            "longest_wake_delay_s": max(late) if late else None,
            "exit_codes": [s["exit_code"] for s in result["survivors"]],
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="kill,stop,load")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    parts = ["kill", "load"] if args.smoke else args.parts.split(",")
    if args.smoke:  # the peer's wait shortened: the smoke checks the code runs
        global _JAX_HEARTBEAT
        _JAX_HEARTBEAT = 5
    with tempfile.TemporaryDirectory(prefix="meshfeed-lost-") as tmp:
        for part in parts:
            if part in ("kill", "stop"):
                _deaths(Path(tmp), part, 1 if args.smoke else args.rounds)
            elif part == "load":
                _load(Path(tmp), 15 if args.smoke else 300)
            else:
                raise SystemExit(f"unknown part {part!r}; pass kill, stop or load.")


if __name__ == "__main__":
    main()
