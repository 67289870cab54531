"""fit writing its figures to a metric writer, against fit writing none.

The demo's convnet on the digits under ``fit(log_every=20)``: no writer, tensorboardX's
``SummaryWriter`` and a CLU-style writer, rotating rounds, steps/s and the median of
per-round ratios to ``none``. Goal: >= 0.97. ``--smoke`` for CI.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from collections.abc import Mapping
from typing import Any

import jax
import optax
from harness import arguments, emit, in_rounds, median_of, use_cpu_devices

import meshfeed
from common import DIGITS_BATCH_SIZE, DIGITS_LEARNING_RATE, digits, digits_loss, digits_params

LOG_EVERY = 20  # fit's default
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

        return SummaryWriter(logdir=folder)
    return CluLike() if name == "clu-like" else None


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=300, help="steps per entry per round")
    parser.add_argument("--log-every", type=int, default=LOG_EVERY, help="fit's log_every")


def main() -> None:
    use_cpu_devices()
    args = arguments(__doc__, rounds=7, smoke={"steps": 20, "rounds": 1}, add=_flags)
    mesh = meshfeed.make_mesh(data=jax.device_count())
    loader = meshfeed.Loader(
        meshfeed.ArraySource(digits()),
        global_batch_size=DIGITS_BATCH_SIZE,
        sharding=meshfeed.batch_sharding(mesh),
        num_epochs=None,
    )
    optimizer = optax.adam(DIGITS_LEARNING_RATE)
    state = meshfeed.TrainState.create(digits_params(), optimizer, mesh=mesh)
    step = meshfeed.make_train_step(digits_loss, optimizer, mesh=mesh)
    state, _ = step(state, loader.batch(0))  # compile outside the timed loops
    jax.block_until_ready(state)
    tmp = tempfile.TemporaryDirectory(prefix="meshfeed-writers-")
    runs = iter(range(1 << 30))

    def entry(name: str) -> float:
        nonlocal state
        writer = _writer(name, os.path.join(tmp.name, f"{name}-{next(runs)}"))
        history = meshfeed.fit(
            step,
            state,
            loader,
            num_steps=args.steps,
            log_every=args.log_every,
            progress=False,
            writer=writer,
        )
        state = history.state  # the given one was donated to the first step
        if writer is not None and hasattr(writer, "close"):
            writer.close()
        return args.steps / history.seconds

    with tmp:
        per_round = in_rounds({name: lambda name=name: entry(name) for name in NAMES}, args.rounds)
    for name in NAMES:
        ratios = [r[name] / r["none"] for r in per_round]
        emit(
            "writers",
            smoke=args.smoke,
            name=name,
            steps=args.steps,
            rounds=args.rounds,
            log_every=args.log_every,
            global_batch_size=DIGITS_BATCH_SIZE,
            steps_per_s=round(median_of(per_round, name) or 0.0, 1),
            ratio_to_none=round(statistics.median(ratios), 3),
            ratio_by_round=[round(x, 3) for x in ratios],
            goal=0.97,
        )


if __name__ == "__main__":
    main()
