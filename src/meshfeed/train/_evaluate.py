"""Evaluation: a metric function's mean over every valid row of a set of batches.

``evaluator(eval_fn)`` compiles ``eval_fn`` once per mesh, weights each batch's means by
its valid rows on the devices, and sums on the host, so a short last batch (rows marked
invalid) counts for what it holds. ``Evaluations`` is when a training loop evaluates:
every ``every`` steps and after the last.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from meshfeed.cluster._watch import activity
from meshfeed.feed._loader import Loader
from meshfeed.train._step_parts import Batch, valid_rows
from meshfeed.train._train_state import TrainState

EvalFn = Callable[..., Mapping[str, jax.Array]]
"""``eval_fn(params, batch) -> {name: mean over the valid rows}``; with model state,
``eval_fn(params, batch, model_state)``."""


def floats(metrics: Mapping[str, jax.Array]) -> dict[str, float]:
    """Each value as a Python float (waits for the devices)."""
    return {name: float(value) for name, value in metrics.items()}


def evaluator(eval_fn: EvalFn) -> Callable[[Any, Iterable[Batch]], dict[str, float]]:
    """``evaluate(state, batches)``: each of ``eval_fn``'s values, its mean over every
    valid row of ``batches`` (a Loader starts over first)."""
    compiled: dict[Any, Any] = {}

    def weighted(args: tuple[Any, ...], batch: Batch) -> tuple[Any, jax.Array]:
        n = valid_rows(batch)
        means = eval_fn(args[0], batch, *args[1:])
        return {name: jnp.asarray(value) * n for name, value in means.items()}, n

    def run(state: Any, batches: Iterable[Batch]) -> dict[str, float]:
        model_state = state.model_state if isinstance(state, TrainState) else None
        args = (state.params,) if model_state is None else (state.params, model_state)
        if isinstance(batches, Loader):  # evaluated whole each time
            batches.reset()
        sums: dict[str, float] = {}
        count = 0.0
        for batch in batches:
            mesh = next(iter(batch.values())).sharding.mesh  # type: ignore[attr-defined]
            if mesh not in compiled:
                compiled[mesh] = jax.jit(weighted, out_shardings=NamedSharding(mesh, P()))
            sums_here, n = compiled[mesh](args, batch)
            for name, value in floats(sums_here).items():
                sums[name] = sums.get(name, 0.0) + value
            count += float(n)
        return {name: value / max(count, 1.0) for name, value in sums.items()}

    return run


class Evaluations:
    """A loop's evaluations: ``eval_fn`` over ``batches`` every ``every`` steps and after
    the ``last``; nothing without an ``eval_fn``."""

    def __init__(
        self, eval_fn: EvalFn | None, batches: Iterable[Batch] | None, every: int, last: int
    ) -> None:
        self._evaluate = None if eval_fn is None or batches is None else evaluator(eval_fn)
        self._batches = batches
        self.every = every
        self.last = last

    def due(self, step: int) -> bool:
        return self._evaluate is not None and (step % self.every == 0 or step == self.last)

    def run(self, step: int, state: Any) -> dict[str, float]:
        """``{"step": step, name: mean, ...}`` of ``state`` (call where ``due``)."""
        assert self._evaluate is not None and self._batches is not None
        with activity(f"evaluating at step {step}"):
            return {"step": float(step), **self._evaluate(state, self._batches)}
