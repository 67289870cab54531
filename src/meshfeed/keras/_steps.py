"""A Keras model's train step and evaluation, built on ``meshfeed.make_train_step``.

The step is meshfeed's own, in any of its modes, with a stateful loss that runs the
model through ``stateless_call``: the state's values in, the forward pass's new
non-trainable values (batch statistics, seed states) out as model state. Loss and
metrics are means over the batch's valid rows, the form the manual modes weight by each
device's rows and ``meshfeed.fit``'s evaluation weights by each batch's; a metric is
computed on each batch from a fresh state (``stateless_reset_state``), so one whose
result is a mean over rows (accuracy, a loss, an error) averages exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import keras
from jax.sharding import Mesh

from meshfeed.core._mesh import DATA
from meshfeed.feed._schedule import MASK
from meshfeed.keras._state import Optimizer, Variables, transformation
from meshfeed.train._evaluate import EvalFn
from meshfeed.train._fit import StepFn
from meshfeed.train._step_parts import Batch, Mode, masked_mean
from meshfeed.train._steps import make_train_step as _make_step


class Objective:
    """What a step or an evaluation computes from a batch: the loss and the metrics."""

    def __init__(self, loss: Any, metrics: Sequence[Any] | None, x: Any, y: str) -> None:
        self.loss: Any = keras.losses.get(loss) if isinstance(loss, str) else loss
        if not callable(self.loss):
            raise TypeError(f"loss={loss!r} is not a Keras loss, a loss function or its name.")
        self.metrics: list[Any] = [_metric(m, loss) for m in (metrics or [])]
        self.x = (x,) if isinstance(x, str) else tuple(x)
        self.y = y

    def inputs(self, batch: Batch) -> Any:
        """The model's input(s) from ``batch``; a missing field is named."""
        missing = [k for k in (*self.x, self.y) if k not in batch]
        if missing:
            raise ValueError(
                f"the batch has fields {sorted(batch)} but the model reads {missing}; pass "
                "x=<input field(s)> and y=<target field> (to make_train_step, make_eval_fn "
                "or fit)."
            )
        return batch[self.x[0]] if len(self.x) == 1 else [batch[k] for k in self.x]

    def __call__(
        self, batch: Batch, y_pred: Any, losses: Sequence[Any]
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The mean loss over the valid rows plus the model's own, and the metrics."""
        y = batch[self.y]
        if isinstance(self.loss, keras.losses.Loss):
            per_row = self.loss.call(y, y_pred)  # unreduced: one value per row
        else:
            per_row = self.loss(y, y_pred)
        loss = masked_mean(per_row, batch)
        for extra in losses:
            loss = loss + extra
        weight = batch.get(MASK)
        values = {}
        for m in self.metrics:
            own = m.stateless_update_state(
                m.stateless_reset_state(), y, y_pred, sample_weight=weight
            )
            values[m.name] = m.stateless_result(own)
        return loss, values


def _metric(metric: Any, loss: Any) -> Any:
    if isinstance(metric, keras.metrics.Metric):
        return metric
    if metric in ("accuracy", "acc"):
        name = (loss if isinstance(loss, str) else type(loss).__name__).lower().replace("_", "")
        for kind, accuracy in (
            ("sparsecategorical", keras.metrics.SparseCategoricalAccuracy),
            ("categorical", keras.metrics.CategoricalAccuracy),
            ("binary", keras.metrics.BinaryAccuracy),
        ):
            if kind in name:
                return accuracy(name="accuracy")
        raise ValueError(
            f"metrics=['accuracy'] cannot tell which accuracy fits loss={loss!r}; pass a "
            "metric object, e.g. keras.metrics.SparseCategoricalAccuracy()."
        )
    found = keras.metrics.get(metric)
    if isinstance(found, keras.metrics.Metric):
        return found
    return keras.metrics.MeanMetricWrapper(found, name=str(metric))


def make_train_step(
    model: keras.Model,
    loss: Any,
    optimizer: Optimizer,
    *,
    mesh: Mesh,
    mode: Mode = "jit",
    x: str | Sequence[str] = "x",
    y: str = "y",
    metrics: Sequence[Any] | None = None,
    batch_axes: Sequence[str] = (DATA,),
) -> StepFn:
    """``step(state, batch) -> (state, metrics)`` training ``model``'s values in a state.

    Args:
      model: the model the state was made from (only its structure is used).
      loss: a ``keras.losses.Loss``, a loss function or its name; averaged over the
        valid rows (``mask == True``), plus the model's own losses.
      optimizer: the one given to ``create_state``.
      mesh, mode, batch_axes: as for ``meshfeed.make_train_step``. ``"shard_map"`` and
        ``"pmap"`` refuse a set ``ModelParallel`` distribution, under which Keras lays
        layer outputs out over the whole mesh inside the model, which a function of one
        device's rows cannot do: pass its ``layout_map`` to ``create_state`` instead.
      x: batch field(s) fed to the model (a name or a list of names).
      y: batch field holding the targets.
      metrics: metric objects or names (``"accuracy"`` follows the loss, as in
        ``model.compile``); the step reports each one's value on its batch.

    Example:
      >>> step = meshfeed.keras.make_train_step(  # doctest: +SKIP
      ...     model, "sparse_categorical_crossentropy", optimizer, mesh=mesh,
      ...     mode="shard_map", x="image", y="label", metrics=["accuracy"])
      >>> history = meshfeed.fit(step, state, loader)  # doctest: +SKIP
    """
    variables = Variables(model)
    objective = Objective(loss, metrics, x, y)
    if mode != "jit" and isinstance(
        keras.distribution.distribution(), keras.distribution.ModelParallel
    ):
        raise ValueError(
            f"mode={mode!r} runs the model on each device's rows, but a Keras ModelParallel "
            "distribution is set, under which the model lays layer outputs out over the "
            "whole mesh; pass its layout_map to meshfeed.keras.create_state(..., "
            "layout_map=) without setting the distribution, or use mode='jit'."
        )

    def stateful_loss(params: Any, batch: Batch, model_state: Any, rng: Any) -> Any:
        if rng is None:
            raise ValueError("the state has no rng; build it with meshfeed.keras.create_state.")
        inputs = objective.inputs(batch)
        y_pred, model_state, losses = variables.call(params, model_state, inputs, rng=rng)
        loss, values = objective(batch, y_pred, losses)
        return loss, (values, model_state)

    return _make_step(
        stateful_loss,
        transformation(optimizer, variables),
        mesh=mesh,
        mode=mode,
        batch_axes=batch_axes,
        stateful=True,
    )


def make_eval_fn(
    model: keras.Model,
    loss: Any,
    *,
    x: str | Sequence[str] = "x",
    y: str = "y",
    metrics: Sequence[Any] | None = None,
) -> EvalFn:
    """``eval_fn(params, batch, model_state)`` for ``meshfeed.fit``'s evaluation.

    It returns ``{"loss": ..., <metric name>: ...}``, each the mean over the batch's
    valid rows, with ``model`` in inference mode (moving statistics, no dropout).
    Arguments as for ``make_train_step``.
    """
    variables = Variables(model)
    objective = Objective(loss, metrics, x, y)

    def eval_fn(params: Any, batch: Batch, model_state: Any) -> Mapping[str, jax.Array]:
        y_pred, _, losses = variables.call(params, model_state, objective.inputs(batch))
        loss, values = objective(batch, y_pred, losses)
        return {"loss": loss, **values}

    return eval_fn
