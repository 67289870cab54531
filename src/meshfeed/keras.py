"""Keras 3 (JAX backend) models trained on a mesh, fed by a meshfeed Loader.

``KerasTrainer`` runs the stateless training step of the Keras multi-device guide --
``model.stateless_call``, ``optimizer.stateless_apply``, gradients by
``jax.value_and_grad`` -- with every piece of state (trainable and non-trainable
variables such as batch-norm statistics and dropout seeds, optimizer and metric
variables) placed once with a ``NamedSharding`` and carried through one jitted step.
Batches come from a ``meshfeed.Loader``, already global arrays; nothing goes through a
cross-process ``device_put``. After ``fit`` the model's variables hold the trained values
(``model.predict``, ``evaluate`` and ``save`` work as usual). Data parallel by default
(variables replicated, batch split over ``batch_axes``); for model parallelism pass a
``keras.distribution.LayoutMap`` whose axis names are the mesh's (or set a
``keras.distribution.ModelParallel``): variables get those layouts, jit does the rest.

An optional extra (``pip install 'meshfeed[keras]'``), on the JAX backend only: set
``KERAS_BACKEND=jax`` before Keras is first imported.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

try:
    import keras
except ImportError as error:
    raise ImportError(
        "meshfeed.keras needs Keras 3 on the JAX backend, and importing keras failed "
        f"({error}). Install it with pip install 'meshfeed[keras]'"
        " (from a clone: pip install -e '.[keras]') and set "
        "KERAS_BACKEND=jax before keras is first imported (os.environ['KERAS_BACKEND'] "
        "= 'jax' at the top of your script)."
    ) from error

if keras.backend.backend() != "jax":
    raise ImportError(
        f"meshfeed.keras needs Keras on the JAX backend, but Keras runs on "
        f"{keras.backend.backend()!r}; set KERAS_BACKEND=jax before keras is first imported "
        "(os.environ['KERAS_BACKEND'] = 'jax' at the top of your script)."
    )

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from meshfeed.feed._schedule import MASK
from meshfeed.feed._shardings import place_host
from meshfeed.train._fit import fit as _fit
from meshfeed.train._steps import masked_mean

__all__ = ["KerasTrainer"]

State = tuple[Any, Any, Any, Any]  # trainable, non-trainable, optimizer, metric variables


class KerasTrainer:
    """Trains a built Keras model on ``mesh`` with batches from a meshfeed Loader.

    Args:
      model: a built ``keras.Model`` (give it a ``keras.Input`` or call ``build``).
      optimizer: a ``keras.optimizers.Optimizer``.
      loss: a ``keras.losses.Loss``, a loss function or its name. Padded rows
        (``mask == False``) do not count: the per-example losses are averaged over the
        valid rows.
      metrics: metric objects or names (``"accuracy"`` follows the loss, as in
        ``model.compile``).
      mesh: the mesh the batches live on.
      layout_map: a ``keras.distribution.LayoutMap`` for model parallelism; default: the
        layouts of a ``ModelParallel`` distribution if one is set, else replicated.
      x: batch field(s) fed to the model (a name or a list of names).
      y: batch field holding the targets.

    Example:
      >>> trainer = KerasTrainer(model, optimizer=keras.optimizers.Adam(1e-3),  # doctest: +SKIP
      ...     loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      ...     metrics=["accuracy"], mesh=mesh, x="image", y="label")
      >>> history = trainer.fit(loader, epochs=2, eval_loader=eval_loader)  # doctest: +SKIP
    """

    def __init__(
        self,
        model: keras.Model,
        *,
        optimizer: keras.optimizers.Optimizer,
        loss: Any,
        metrics: Sequence[Any] | None = None,
        mesh: Mesh,
        layout_map: keras.distribution.LayoutMap | None = None,
        x: str | Sequence[str] = "x",
        y: str = "y",
    ) -> None:
        if not isinstance(model, keras.Model):
            raise TypeError(f"model is a {type(model).__name__}; pass a keras.Model.")
        if not model.built or not model.trainable_variables:
            raise ValueError(
                "the model has no variables yet; build it first (start it with keras.Input, "
                "or call model.build(input_shape))."
            )
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise TypeError(
                f"optimizer is a {type(optimizer).__name__}; pass a keras.optimizers.Optimizer, "
                "e.g. keras.optimizers.Adam(1e-3)."
            )
        if not isinstance(mesh, Mesh):
            raise TypeError(f"mesh is a {type(mesh).__name__}; pass a jax.sharding.Mesh.")
        if layout_map is not None and not isinstance(layout_map, keras.distribution.LayoutMap):
            raise TypeError(
                f"layout_map is a {type(layout_map).__name__}; pass a keras.distribution.LayoutMap."
            )
        # Any: Keras' own annotations are too loose for a type checker to follow.
        self.model: Any = model
        self.optimizer: Any = optimizer
        self.mesh = mesh
        self.x = (x,) if isinstance(x, str) else tuple(x)
        self.y = y
        self._loss: Any = keras.losses.get(loss) if isinstance(loss, str) else loss
        if not callable(self._loss):
            raise TypeError(f"loss={loss!r} is not a Keras loss, a loss function or its name.")
        self._metrics = _Metrics([_metric(m, loss) for m in (metrics or [])], mesh)
        optimizer.build(model.trainable_variables)
        self._replicated = NamedSharding(mesh, P())
        variables = _place_variables(model, optimizer, mesh, layout_map)
        self.state: State = (*variables, self._metrics.fresh())
        self._train_step = jax.jit(
            self._step, out_shardings=(_shardings(self.state), self._replicated)
        )
        self._eval_step = jax.jit(self._evaluate_batch, out_shardings=_shardings(self.state[3]))

    def _inputs(self, batch: Mapping[str, jax.Array]) -> Any:
        missing = [k for k in (*self.x, self.y) if k not in batch]
        if missing:
            raise ValueError(
                f"the batch has fields {sorted(batch)} but the trainer reads {missing}; pass "
                "KerasTrainer(..., x=<input field(s)>, y=<target field>)."
            )
        return batch[self.x[0]] if len(self.x) == 1 else [batch[k] for k in self.x]

    def _per_example_loss(self, y: Any, y_pred: Any) -> jax.Array:
        if isinstance(self._loss, keras.losses.Loss):
            return self._loss.call(y, y_pred)
        return self._loss(y, y_pred)

    def _step(self, state: State, batch: Any) -> tuple[State, dict[str, jax.Array]]:
        trainable, non_trainable, optimizer_vars, metric_vars = state
        inputs = self._inputs(batch)

        def loss_fn(trainable: Any, non_trainable: Any) -> Any:
            y_pred, non_trainable, losses = self.model.stateless_call(
                trainable, non_trainable, inputs, training=True, return_losses=True
            )
            loss = masked_mean(self._per_example_loss(batch[self.y], y_pred), batch)
            for extra in losses:
                loss = loss + extra
            return loss, (y_pred, non_trainable)

        (loss, (y_pred, non_trainable)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            trainable, non_trainable
        )
        trainable, optimizer_vars = self.optimizer.stateless_apply(optimizer_vars, grads, trainable)
        metric_vars = self._metrics.update(metric_vars, batch[self.y], y_pred, loss, batch)
        new_state = (trainable, non_trainable, optimizer_vars, metric_vars)
        return new_state, self._metrics.results(metric_vars)

    def _evaluate_batch(
        self, trainable: Any, non_trainable: Any, metric_vars: Any, batch: Any
    ) -> Any:
        y_pred, _ = self.model.stateless_call(
            trainable, non_trainable, self._inputs(batch), training=False
        )
        loss = masked_mean(self._per_example_loss(batch[self.y], y_pred), batch)
        return self._metrics.update(metric_vars, batch[self.y], y_pred, loss, batch)

    def fit(
        self,
        loader: Any,
        *,
        epochs: int = 1,
        eval_loader: Any = None,
        steps_per_epoch: int | None = None,
        progress: bool = True,
    ) -> keras.callbacks.History:
        """Trains for ``epochs`` epochs of ``loader``; returns a Keras ``History``.

        ``history.history`` holds the epoch means of the loss and metrics, and the
        ``val_`` ones when ``eval_loader`` is given. The model's variables hold the
        trained values afterwards.
        """
        if not isinstance(epochs, int) or epochs < 1:
            raise ValueError(f"epochs={epochs!r} must be an int >= 1.")
        steps = steps_per_epoch or getattr(loader, "steps_per_epoch", None)
        if not steps:
            raise ValueError(
                "pass steps_per_epoch=, or a meshfeed.Loader (which knows its epoch length)."
            )
        _check_enough_steps(loader, epochs, steps)
        history = keras.callbacks.History()
        history.set_model(self.model)
        history.on_train_begin()
        iterator = _Continuing(loader)
        for epoch in range(epochs):
            trainable, non_trainable, optimizer_vars, _ = self.state
            self.state = (trainable, non_trainable, optimizer_vars, self._metrics.fresh())
            run = _fit(
                self._train_step,
                self.state,
                iterator,
                num_steps=steps,
                log_every=max(1, steps // 4) if sys.stdout.isatty() else steps,
                progress=progress,
                description=f"epoch {epoch + 1}/{epochs}",
            )
            self.state = run.state
            logs = {k: v for k, v in run.train[-1].items() if k not in _FIT_EXTRAS}
            if eval_loader is not None:
                logs.update({f"val_{k}": v for k, v in self.evaluate(eval_loader).items()})
            history.on_epoch_end(epoch, logs)
            if progress and jax.process_index() == 0:
                summary = "  ".join(f"{k} {v:.4f}" for k, v in logs.items())
                print(f"epoch {epoch + 1}/{epochs}: {summary}", flush=True)
            if run.steps < steps:
                break  # the loader ran out
        self.write_back()
        return history

    def evaluate(self, loader: Any) -> dict[str, float]:
        """Loss and metrics over every valid row of ``loader`` (reset first if it can be)."""
        reset = getattr(loader, "reset", None)
        if callable(reset):
            reset()
        trainable, non_trainable, _, _ = self.state
        metric_vars = self._metrics.fresh()
        for batch in loader:
            metric_vars = self._eval_step(trainable, non_trainable, metric_vars, batch)
        return {name: float(value) for name, value in self._metrics.results(metric_vars).items()}

    def write_back(self) -> None:
        """Copies the trained values into the model's and the optimizer's variables."""
        trainable, non_trainable, optimizer_vars, _ = self.state
        pairs = [
            (self.model.trainable_variables, trainable),
            (self.model.non_trainable_variables, non_trainable),
            (self.optimizer.variables, optimizer_vars),
        ]
        for variables, values in pairs:
            for variable, value in zip(variables, values, strict=True):
                variable.assign(_to_host(value))


def _shardings(tree: Any) -> Any:
    return jax.tree.map(lambda a: a.sharding, tree)


def _layout(variable: Any, mesh: Mesh, layout_map: Any) -> NamedSharding:
    """The sharding of one Keras variable: from ``layout_map``, the distribution, or none."""
    layout: Any = None
    if layout_map is not None:
        layout = layout_map[variable.path]
    else:
        distribution = keras.distribution.distribution()
        if isinstance(distribution, keras.distribution.ModelParallel):
            layout = distribution.get_variable_layout(variable)
    axes: tuple[Any, ...] = tuple(getattr(layout, "axes", ()) or ())
    if not axes:
        return NamedSharding(mesh, P())
    unknown = [a for a in axes if a is not None and a not in mesh.axis_names]
    if unknown:
        raise ValueError(
            f"the layout of {variable.path} names mesh axes {unknown}, but the mesh has "
            f"{tuple(mesh.axis_names)}; build the LayoutMap on a DeviceMesh with "
            "the same axis names."
        )
    return NamedSharding(mesh, P(*axes))


def _place_variables(
    model: Any, optimizer: Any, mesh: Mesh, layout_map: Any
) -> tuple[Any, Any, Any]:
    """Trainable, non-trainable and optimizer variables, placed on ``mesh``.

    An optimizer variable (a moment, say) takes the layout of the trainable variable it
    belongs to, found by name and shape; the rest are replicated.
    """
    trainable = model.trainable_variables
    shardings = {v.path: _layout(v, mesh, layout_map) for v in trainable}
    by_prefix = {v.path.replace("/", "_"): v for v in trainable}

    def optimizer_sharding(variable: Any) -> NamedSharding:
        for prefix, reference in by_prefix.items():
            if variable.name.startswith(prefix) and tuple(variable.shape) == tuple(reference.shape):
                return shardings[reference.path]
        return NamedSharding(mesh, P())

    groups = [
        (trainable, [shardings[v.path] for v in trainable]),
        (
            model.non_trainable_variables,
            [_layout(v, mesh, layout_map) for v in model.non_trainable_variables],
        ),
        (optimizer.variables, [optimizer_sharding(v) for v in optimizer.variables]),
    ]
    values = [[np.asarray(v.value) for v in group] for group, _ in groups]
    if jax.process_count() > 1:
        # Replicas must start equal: every process takes process 0's initial values.
        values = jax.tree.map(np.asarray, multihost_utils.broadcast_one_to_all(values))
    trainable_values, non_trainable_values, optimizer_values = (
        [place_host(value, s) for value, s in zip(vals, group_shardings, strict=True)]
        for vals, (_, group_shardings) in zip(values, groups, strict=True)
    )
    return trainable_values, non_trainable_values, optimizer_values


class _Metrics:
    """The loss tracker and the metrics, updated statelessly inside the jitted steps."""

    def __init__(self, metrics: list[keras.metrics.Metric], mesh: Mesh) -> None:
        self._all: list[Any] = [keras.metrics.Mean(name="loss"), *metrics]
        self._replicated = NamedSharding(mesh, P())

    def fresh(self) -> list[list[jax.Array]]:
        return [
            [place_host(np.zeros(v.shape, v.dtype), self._replicated) for v in m.variables]
            for m in self._all
        ]

    def update(
        self, variables: list[list[jax.Array]], y: Any, y_pred: Any, loss: jax.Array, batch: Any
    ) -> list[list[jax.Array]]:
        weight = batch.get(MASK)
        count = jnp.sum(weight.astype(jnp.float32)) if weight is not None else None
        tracker, *metrics = self._all
        updated = [tracker.stateless_update_state(variables[0], loss, sample_weight=count)]
        for metric, own in zip(metrics, variables[1:], strict=True):
            updated.append(metric.stateless_update_state(own, y, y_pred, sample_weight=weight))
        return updated

    def results(self, variables: list[list[jax.Array]]) -> dict[str, jax.Array]:
        return {
            m.name: m.stateless_result(own) for m, own in zip(self._all, variables, strict=True)
        }


_FIT_EXTRAS = ("step", "samples_per_s", "input_wait_share", "batch_size", "mix_stage")


class _Continuing:
    """One iterator over a loader, kept across epochs (fit asks for a number of steps)."""

    def __init__(self, loader: Any) -> None:
        self._iterator, self.stage = iter(loader), getattr(loader, "stage", None)  # fit logs it

    def __iter__(self) -> Any:
        return self._iterator


def _metric(metric: Any, loss: Any) -> keras.metrics.Metric:
    if isinstance(metric, keras.metrics.Metric):
        return metric
    if metric in ("accuracy", "acc"):
        name = loss if isinstance(loss, str) else type(loss).__name__
        name = name.lower().replace("_", "")
        if "sparsecategorical" in name:
            return keras.metrics.SparseCategoricalAccuracy(name="accuracy")
        if "categorical" in name:
            return keras.metrics.CategoricalAccuracy(name="accuracy")
        if "binary" in name:
            return keras.metrics.BinaryAccuracy(name="accuracy")
        raise ValueError(
            f"metrics=['accuracy'] cannot tell which accuracy fits loss={loss!r}; pass a "
            "metric object, e.g. keras.metrics.SparseCategoricalAccuracy()."
        )
    found = keras.metrics.get(metric)
    if isinstance(found, keras.metrics.Metric):
        return found
    return keras.metrics.MeanMetricWrapper(found, name=str(metric))


def _to_host(value: jax.Array) -> np.ndarray:
    if value.is_fully_addressable or value.is_fully_replicated:
        return np.asarray(value)
    return np.asarray(multihost_utils.process_allgather(value, tiled=True))


def _check_enough_steps(loader: Any, epochs: int, steps: int) -> None:
    """Refuses, before training, a finite loader that runs out before ``epochs``."""
    try:
        length = len(loader)  # a Loader's pass: at its end, a loop runs the next one
        left = length - getattr(loader, "step", 0) % length
    except TypeError:
        return  # endless
    if left < epochs * steps:
        raise ValueError(
            f"fit(epochs={epochs}) needs {epochs} x {steps} steps, but the loader has {left} "
            "left; build the Loader with num_epochs=None (endless: fit stops after "
            f"{epochs} epochs) or num_epochs={epochs}, or pass fewer epochs."
        )
