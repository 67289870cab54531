"""``fit``: a Keras model trained by ``meshfeed.fit`` in one call, a Keras ``History`` back.

Each epoch is one ``meshfeed.fit`` of ``steps_per_epoch`` steps on the same loader
(which holds its position, so the next epoch goes on from it), then an evaluation; the
History holds each epoch's means over the valid rows of its batches, as ``model.fit``
reports them. ``KerasTrainer``, the trainer class of earlier releases, is a deprecated
wrapper over ``fit``.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import keras
from jax.sharding import Mesh

from meshfeed.feed._loader import Loader
from meshfeed.keras._state import Optimizer, create_state, update_model
from meshfeed.keras._steps import make_eval_fn, make_train_step
from meshfeed.train._evaluate import evaluator
from meshfeed.train._fit import StepFn
from meshfeed.train._fit import fit as run_steps
from meshfeed.train._step_parts import Batch, Mode, valid_rows


def fit(
    model: keras.Model,
    loader: Iterable[Batch],
    *,
    optimizer: Optimizer,
    loss: Any,
    mesh: Mesh,
    metrics: Sequence[Any] | None = None,
    x: str | Sequence[str] = "x",
    y: str = "y",
    epochs: int = 1,
    steps_per_epoch: int | None = None,
    eval_loader: Iterable[Batch] | None = None,
    mode: Mode = "jit",
    layout_map: keras.distribution.LayoutMap | None = None,
    seed: int = 0,
    progress: bool = True,
) -> keras.callbacks.History:
    """Trains ``model`` for ``epochs`` epochs of ``loader`` and writes the values back.

    ``create_state``, ``make_train_step`` and ``make_eval_fn`` with these arguments,
    ``meshfeed.fit`` for each epoch, then ``update_model`` (the Keras optimizer's
    variables too). ``history.history`` holds each epoch's means of the loss and the
    metrics, and the ``val_`` ones over ``eval_loader`` when it is given.

    Args:
      loader: a ``meshfeed.Loader`` (an epoch is its ``steps_per_epoch``), or any
        iterable of batches with ``steps_per_epoch``.
      steps_per_epoch: steps in an epoch; default: the Loader's.
      progress: ``meshfeed.fit``'s progress, and a line per epoch, on process 0.
      optimizer, loss, mesh, metrics, x, y, mode, layout_map, seed: as for
        ``create_state`` and ``make_train_step``.

    Example:
      >>> history = meshfeed.keras.fit(  # doctest: +SKIP
      ...     model, loader, optimizer=keras.optimizers.Adam(1e-3), mesh=mesh,
      ...     loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      ...     metrics=["accuracy"], x="image", y="label", epochs=2, eval_loader=eval_loader)
    """
    if not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs={epochs!r} must be an int >= 1.")
    feed = loader if isinstance(loader, Loader) else None
    steps = steps_per_epoch
    if steps is None and feed is not None:
        steps = feed.steps_per_epoch
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(
            f"steps_per_epoch={steps!r}: pass an int >= 1 (a meshfeed.Loader gives its "
            "own, unless its batch size ramps; another iterable does not say)."
        )
    if feed is not None:
        _check_enough_steps(feed, epochs, steps)
    step = _EpochMeans(
        make_train_step(model, loss, optimizer, mesh=mesh, mode=mode, x=x, y=y, metrics=metrics)
    )
    evaluate = None
    if eval_loader is not None:
        evaluate = evaluator(make_eval_fn(model, loss, x=x, y=y, metrics=metrics))
    state = create_state(model, optimizer, mesh=mesh, layout_map=layout_map, seed=seed)
    history = keras.callbacks.History()
    history.set_model(model)
    history.on_train_begin()
    batches = feed if feed is not None else iter(loader)  # one iterator across epochs
    for epoch in range(epochs):
        run = run_steps(
            step,
            state,
            batches,
            num_steps=steps,
            log_every=max(1, steps // 4) if sys.stdout.isatty() else steps,
            progress=progress,
            description=f"epoch {epoch + 1}/{epochs}",
        )
        state = run.state
        logs = step.means()
        if evaluate is not None and eval_loader is not None:
            logs.update({f"val_{k}": v for k, v in evaluate(state, eval_loader).items()})
        history.on_epoch_end(epoch, logs)
        if progress and jax.process_index() == 0:
            summary = "  ".join(f"{k} {v:.4f}" for k, v in logs.items())
            print(f"epoch {epoch + 1}/{epochs}: {summary}", flush=True)
        if run.steps < steps:
            break  # an iterable that ran out
    keras_optimizer = optimizer if isinstance(optimizer, keras.optimizers.Optimizer) else None
    update_model(model, state, optimizer=keras_optimizer)
    return history


class _EpochMeans:
    """A step that also sums its metrics weighted by valid rows, for the epoch's means
    (on the devices: nothing waits for them until ``means``)."""

    def __init__(self, step: StepFn) -> None:
        self._step = step
        self._sums: dict[str, jax.Array] = {}
        self._rows: Any = 0.0

    def __call__(self, state: Any, batch: Batch) -> tuple[Any, Mapping[str, jax.Array]]:
        state, metrics = self._step(state, batch)
        rows = valid_rows(batch)
        self._rows = self._rows + rows
        self._sums = {k: self._sums.get(k, 0.0) + v * rows for k, v in metrics.items()}
        return state, metrics

    def means(self) -> dict[str, float]:
        """This epoch's means; the sums start again."""
        rows = max(float(self._rows), 1.0)
        means = {k: float(v) / rows for k, v in self._sums.items()}
        self._sums, self._rows = {}, 0.0
        return means


def _check_enough_steps(loader: Loader, epochs: int, steps: int) -> None:
    """Refuses, before training, a finite loader that runs out before ``epochs``."""
    try:
        length = len(loader)  # a pass: at its end, a loop runs the next one
    except TypeError:
        return  # endless
    left = length - loader.step % length
    if left < epochs * steps:
        raise ValueError(
            f"fit(epochs={epochs}) needs {epochs} x {steps} steps, but the loader has {left} "
            "left; build the Loader with num_epochs=None (endless: fit stops after "
            f"{epochs} epochs) or num_epochs={epochs}, or pass fewer epochs."
        )


class KerasTrainer:
    """Deprecated: use ``meshfeed.keras.fit``, or ``create_state``, ``make_train_step``,
    ``make_eval_fn`` and ``update_model`` with ``meshfeed.fit``.

    Takes the arguments it took before (``model``, ``optimizer=``, ``loss=``,
    ``metrics=``, ``mesh=``, ``layout_map=``, ``x=``, ``y=``); ``fit`` calls
    ``meshfeed.keras.fit`` with them, and ``evaluate`` evaluates the model's values.
    """

    def __init__(
        self,
        model: keras.Model,
        *,
        optimizer: Optimizer,
        loss: Any,
        metrics: Sequence[Any] | None = None,
        mesh: Mesh,
        layout_map: keras.distribution.LayoutMap | None = None,
        x: str | Sequence[str] = "x",
        y: str = "y",
    ) -> None:
        warnings.warn(
            "meshfeed.keras.KerasTrainer is deprecated and goes in the next release; use "
            "meshfeed.keras.fit(model, loader, optimizer=..., loss=..., mesh=...), or "
            "meshfeed.keras.create_state, make_train_step, make_eval_fn and update_model "
            "with meshfeed.fit.",
            DeprecationWarning,
            stacklevel=2,
        )
        make_train_step(model, loss, optimizer, mesh=mesh, x=x, y=y, metrics=metrics)  # checks
        self.model = model
        self._kwargs: dict[str, Any] = dict(
            optimizer=optimizer, loss=loss, metrics=metrics, mesh=mesh, x=x, y=y
        )
        self._layout_map = layout_map

    def fit(
        self,
        loader: Iterable[Batch],
        *,
        epochs: int = 1,
        eval_loader: Iterable[Batch] | None = None,
        steps_per_epoch: int | None = None,
        progress: bool = True,
    ) -> keras.callbacks.History:
        """``meshfeed.keras.fit`` with this trainer's arguments."""
        return fit(
            self.model,
            loader,
            **self._kwargs,
            layout_map=self._layout_map,
            epochs=epochs,
            eval_loader=eval_loader,
            steps_per_epoch=steps_per_epoch,
            progress=progress,
        )

    def evaluate(self, loader: Iterable[Batch]) -> dict[str, float]:
        """Loss and metrics of the model's values over every valid row of ``loader``."""
        kw = self._kwargs
        state = create_state(
            self.model, kw["optimizer"], mesh=kw["mesh"], layout_map=self._layout_map
        )
        eval_fn = make_eval_fn(self.model, kw["loss"], x=kw["x"], y=kw["y"], metrics=kw["metrics"])
        return evaluator(eval_fn)(state, loader)
