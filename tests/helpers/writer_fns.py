"""Metric writers of the three kinds fit writes to, and a short fit that uses one;
module level so the processes of run_in_processes import them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax

import meshfeed
import train_fns


class CluLike:
    """What CLU's ``MetricWriter`` offers: ``write_scalars(step, scalars)``."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, dict[str, float]]] = []

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        self.calls.append((step, dict(scalars)))


class WandbLike:
    """What a W&B run offers: ``log(data, step=...)``."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, dict[str, float]]] = []

    def log(self, data: Mapping[str, float], step: int | None = None) -> None:
        assert step is not None
        self.calls.append((step, dict(data)))


def _failing(batches: Any, at: int) -> Any:
    """The batches, until the ``at``-th raises (a source gone bad mid-run)."""
    for i, batch in enumerate(batches):
        if i + 1 == at:
            raise RuntimeError("the input broke")
        yield batch


def fit(
    writer: Any,
    *,
    steps: int = 12,
    log_every: int = 4,
    evaluate: bool = False,
    fail_at: int | None = None,
) -> Any:
    mesh = meshfeed.make_mesh(data=jax.device_count())
    state = meshfeed.TrainState.create(train_fns.init_params(), train_fns.OPTIMIZER, mesh=mesh)
    step = meshfeed.make_train_step(train_fns.loss_fn, train_fns.OPTIMIZER, mesh=mesh)
    extra: dict[str, Any] = {}
    if evaluate:
        extra = {
            "eval_loader": meshfeed.Loader(
                train_fns.source(),
                global_batch_size=train_fns.GLOBAL_BATCH_SIZE,
                sharding=meshfeed.batch_sharding(mesh),
                shuffle=False,
                last_batch="pad",
            ),
            "eval_fn": train_fns.eval_fn,
        }
    return meshfeed.fit(
        step,
        state,
        train_fns.loader(mesh) if fail_at is None else _failing(train_fns.loader(mesh), fail_at),
        num_steps=steps,
        log_every=log_every,
        progress=False,
        writer=writer,
        **extra,
    )


def fit_on_each_process() -> list[tuple[int, dict[str, float]]]:
    """This process's writer's calls after a short fit (process 1's: none)."""
    writer = CluLike()
    fit(writer)
    return writer.calls
