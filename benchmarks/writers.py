"""``fit`` writing its figures to tensorboardX's ``SummaryWriter`` or a CLU-style writer,
against ``fit`` writing none (the demo's convnet on the digits). Goal: >= 0.97x."""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Mapping
from typing import Any

import jax
import optax
from harness import arguments, emit, in_rounds, median_of, median_ratio, use_cpu_devices

import meshfeed
from common import DIGITS_BATCH_SIZE, DIGITS_LEARNING_RATE, digits, digits_loss, digits_params

NAMES = ("none", "tensorboardX", "clu-like")


class CluLike:
    """A writer of CLU's kind that keeps what it is given."""

    def __init__(self) -> None:
        self.count = 0

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        self.count += len(scalars)


def _writer(name: str, folder: str) -> Any:
    if name == "tensorboardX":
        from tensorboardX import SummaryWriter

        return SummaryWriter(logdir=tempfile.mkdtemp(dir=folder))
    return CluLike() if name == "clu-like" else None


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=300, help="steps per entry per round")
    parser.add_argument("--log-every", type=int, default=20, help="fit's log_every")


def main() -> None:
    use_cpu_devices()
    args = arguments(__doc__, rounds=7, smoke={"steps": 20, "rounds": 1}, add=_flags)
    mesh = meshfeed.make_mesh(data=jax.device_count())
    options = {"sharding": meshfeed.batch_sharding(mesh), "num_epochs": None}
    source = meshfeed.ArraySource(digits())
    loader = meshfeed.Loader(source, global_batch_size=DIGITS_BATCH_SIZE, **options)
    optimizer = optax.adam(DIGITS_LEARNING_RATE)
    state = meshfeed.TrainState.create(digits_params(), optimizer, mesh=mesh)
    step = meshfeed.make_train_step(digits_loss, optimizer, mesh=mesh)
    state, _ = step(state, loader.batch(0))  # compile outside the timed loops
    jax.block_until_ready(state)
    tmp = tempfile.TemporaryDirectory(prefix="meshfeed-writers-")

    def entry(name: str) -> float:
        nonlocal state
        writer = _writer(name, tmp.name)
        options = {"log_every": args.log_every, "progress": False, "writer": writer}
        history = meshfeed.fit(step, state, loader, num_steps=args.steps, **options)
        state = history.state  # the given one was donated to the first step
        if hasattr(writer, "close"):
            writer.close()
        return args.steps / history.seconds

    with tmp:
        per_round = in_rounds({name: lambda name=name: entry(name) for name in NAMES}, args.rounds)
    common = {"steps": args.steps, "rounds": args.rounds, "log_every": args.log_every}
    common |= {"global_batch_size": DIGITS_BATCH_SIZE, "goal": 0.97}
    for name in NAMES:
        line: dict[str, Any] = {"steps_per_s": round(median_of(per_round, name) or 0.0, 1)}
        line["ratio_to_none"] = median_ratio(per_round, name, "none")
        line["ratio_by_round"] = [round(r[name] / r["none"], 3) for r in per_round]
        emit("writers", smoke=args.smoke, name=name, **common, **line)


if __name__ == "__main__":
    main()
