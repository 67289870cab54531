"""A training job for the lost-process tests, run as one of N processes.

Started by the tests the way a cluster manager starts a job (each process with its
coordinator, count and id in the environment, no ``meshfeed launch``); one process can
be made to die mid-step (SIGKILL right after dispatching a step), while a checkpoint is
being saved (SIGKILL once Orbax's temporary folder for it appears), to stop (SIGSTOP), or
be told it will be preempted (SIGTERM right after dispatching a step). ``--losses``:
process 0 appends each step's loss to that JSON Lines file (a writer, every step).

``--start`` is how the processes connect: ``env`` (``meshfeed.initialize()`` reads the
environment a cluster manager gave), ``explicit`` (``meshfeed.initialize(coordinator,
num_processes=, process_id=)`` from ``--join``, the environment holding none of it) or
``jax`` (the job's own ``jax.distributed.initialize(...)``; the loader starts the watch).
"""

import argparse
import json
import os
import signal
import threading
import time
from pathlib import Path

import meshfeed

parser = argparse.ArgumentParser()
parser.add_argument("--checkpoint-dir", required=True)
parser.add_argument("--out", required=True)
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--every", type=int, default=3)
parser.add_argument("--kill", choices=["none", "step", "save", "stop", "sigterm"], default="none")
parser.add_argument("--losses", default=None)
parser.add_argument("--victim", type=int, default=1)
parser.add_argument("--at", type=int, default=8)
parser.add_argument("--heartbeat", type=float, default=4.0)
parser.add_argument("--start", choices=["env", "explicit", "jax"], default="env")
parser.add_argument("--join", help="coordinator,num_processes,process_id (explicit, jax)")
args = parser.parse_args()

if args.start == "env":
    meshfeed.initialize(heartbeat_timeout=args.heartbeat)
else:
    coordinator, count, index = args.join.split(",")
    if args.start == "explicit":
        meshfeed.initialize(
            coordinator,
            num_processes=int(count),
            process_id=int(index),
            heartbeat_timeout=args.heartbeat,
        )
    else:
        import jax

        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator, num_processes=int(count), process_id=int(index))

import jax  # noqa: E402
import numpy as np  # noqa: E402

import train_fns  # noqa: E402
from meshfeed.train._checkpoint import Checkpoints  # noqa: E402

victim = args.kill != "none" and jax.process_index() == args.victim


def die() -> None:
    Path(f"{args.out}.died").write_text(str(time.monotonic()))
    os.kill(os.getpid(), signal.SIGSTOP if args.kill == "stop" else signal.SIGKILL)


if victim and args.kill == "save":

    def when_saving() -> None:
        tmp = Path(args.checkpoint_dir) / f"{args.at}.orbax-checkpoint-tmp"
        while not tmp.exists():
            time.sleep(0.001)
        die()

    threading.Thread(target=when_saving, daemon=True).start()

checkpoints = Checkpoints(args.checkpoint_dir)
print(f"process {jax.process_index()}: newest checkpoint {checkpoints.latest_step()}", flush=True)
checkpoints.close()

mesh = meshfeed.make_mesh(data=jax.device_count())
state = meshfeed.TrainState.create(train_fns.init_params(), train_fns.OPTIMIZER, mesh=mesh)
inner = meshfeed.make_train_step(train_fns.loss_fn, train_fns.OPTIMIZER, mesh=mesh)


def step(state, batch):
    number = int(state.step) + 1
    out = inner(state, batch)
    if victim and args.kill in ("step", "stop") and number == args.at:
        die()  # the step is dispatched: the others are in its collectives
    if victim and args.kill == "sigterm" and number == args.at:
        Path(f"{args.out}.told").write_text(str(time.monotonic()))
        os.kill(os.getpid(), signal.SIGTERM)
    return out


class Losses:
    """A writer (CLU's kind): each step's loss, a JSON line each."""

    def write_scalars(self, step, scalars):
        with open(args.losses, "a") as f:
            f.write(json.dumps({"step": step, "loss": float(scalars["train/loss"])}) + "\n")


history = meshfeed.fit(
    step,
    state,
    train_fns.loader(mesh),
    num_steps=args.steps,
    progress=False,
    checkpoint_dir=args.checkpoint_dir,
    checkpoint_every=args.every,
    log_every=1 if args.losses else 20,
    writer=Losses() if args.losses else None,
)
if jax.process_index() == 0:
    params = {n: np.asarray(v.addressable_shards[0].data) for n, v in history.state.params.items()}
    np.savez(args.out, **params)  # type: ignore[arg-type]
print(f"process {jax.process_index()}: done", flush=True)
