"""fit writing its figures to a metric writer, against fit writing none.

The demo's convnet on scikit-learn's digits (batch 64, 8 CPU devices), trained by
``meshfeed.fit`` with its default ``log_every=20`` (``--log-every 5``: writes four times as
often): ``none`` (no writer), ``tensorboardX`` (a ``SummaryWriter`` in a
temporary folder: event files on disk) and ``clu-like`` (an object with
``write_scalars`` that keeps the figures in memory). Every round runs each entry once,
for the same number of steps, in an order that rotates from round to round; steps/s
and the ratio to ``none`` within the round, the line the median over rounds. Goal:
>= 0.97. Prints one JSON line per entry; ``--smoke`` for CI.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import json
import platform
import statistics
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))
import meshfeed
from common import DIGITS_BATCH_SIZE, DIGITS_LEARNING_RATE, digits, digits_loss, digits_params

LOG_EVERY = 20  # fit's default


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


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a short run, for CI")
    parser.add_argument("--steps", type=int, default=300, help="steps per entry per round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds; the median")
    parser.add_argument("--log-every", type=int, default=LOG_EVERY, help="fit's log_every")
    args = parser.parse_args()
    steps, rounds = (20, 1) if args.smoke else (args.steps, args.rounds)
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
    names = ["none", "tensorboardX", "clu-like"]
    rates: dict[str, list[float]] = {n: [] for n in names}
    ratios: dict[str, list[float]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory(prefix="meshfeed-writers-") as tmp:
        for r in range(rounds):
            got = {}
            for name in names[r % len(names) :] + names[: r % len(names)]:
                writer = _writer(name, os.path.join(tmp, f"{name}-{r}"))
                history = meshfeed.fit(
                    step, state, loader, num_steps=steps, log_every=args.log_every,
                    progress=False, writer=writer,
                )  # fmt: skip
                state = history.state  # the given one was donated to the first step
                if writer is not None and hasattr(writer, "close"):
                    writer.close()
                got[name] = steps / history.seconds
            for name in names:
                rates[name].append(got[name])
                ratios[name].append(got[name] / got["none"])
    for name in names:
        print(
            json.dumps(
                {
                    "benchmark": "writers",
                    "name": name,
                    "steps": steps,
                    "rounds": rounds,
                    "log_every": args.log_every,
                    "global_batch_size": DIGITS_BATCH_SIZE,
                    "devices": jax.device_count(),
                    "smoke": args.smoke,
                    "jax": jax.__version__,
                    "python": platform.python_version(),
                    "steps_per_s": round(statistics.median(rates[name]), 1),
                    "ratio_to_none": round(statistics.median(ratios[name]), 3),
                    "ratio_by_round": [round(x, 3) for x in ratios[name]],
                    "goal": 0.97,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
