"""Flax NNX models in meshfeed's training: split into a ``TrainState``, train, merge back.

An NNX model is an object whose variables change as it runs; meshfeed's steps are pure
functions of a ``TrainState``. The helpers here go between the two the way NNX's own
functional API does (``nnx.split`` / ``nnx.merge``):

- ``create_state(model, optimizer, mesh=..., seed=0)``: the model's ``nnx.Param``
  values become ``state.params``, every other variable except the random keys (batch
  statistics, the random streams' counters) ``state.model_state``, both plain nested
  dicts of arrays placed on the mesh. A variable whose sharding annotation names mesh
  axes (``nnx.with_partitioning(init, (None, 'model'))``) keeps that layout, in every
  mode.
- ``make_train_step(model, loss_fn, optimizer, mesh=..., mode=...)``: each step merges
  the values into a copy of the model in training mode (``deterministic=False``,
  ``use_running_average=False``) and calls ``loss_fn(model, batch) -> (loss, metrics)``;
  what the forward pass wrote (new batch statistics) comes back as model state. Dropout
  draws from keys made from ``state.rng`` each step (one per random stream, per step,
  per device in the manual modes), so a run is reproducible and resumes exactly; the
  model's own ``nnx.Rngs`` seed does not matter. In ``"shard_map"`` and ``"pmap"`` every
  ``nnx.BatchNorm`` averages its statistics over the batch axes, so they are those of
  the global batch, as under ``"jit"``.
- ``make_eval_fn(model, metrics_fn)``: for ``meshfeed.fit``'s evaluation, the model in
  evaluation mode (running averages, no dropout).
- ``update_model(model, state)``: writes the trained values into the user's model, in
  their layout (``model(x)``, ``nnx.state(model)`` and Orbax work as usual after).

The values exist once: ``create_state`` hands the state's arrays to the model's variables
(the model keeps working, on the mesh), and the steps donate the state (each step's new
values take the old ones' memory), so after the first step the model's arrays are gone
until ``update_model`` writes the state back. Pass ``donate=False`` to the step to keep
the model usable throughout, at the cost of a second copy during each step.
An optional extra:
``pip install 'meshfeed[flax]'``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

try:
    from flax import nnx
except ImportError as error:
    raise ImportError(
        f"meshfeed.flax needs Flax (importing flax.nnx failed: {error}). Install it with "
        "pip install 'meshfeed[flax]' (from a clone: pip install -e '.[flax]')."
    ) from error

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from meshfeed.core._mesh import DATA
from meshfeed.feed._shardings import place_host
from meshfeed.train._evaluate import EvalFn
from meshfeed.train._fit import StepFn
from meshfeed.train._param_sharding import ParamSharding
from meshfeed.train._step_parts import Batch, Mode, collective_axes
from meshfeed.train._steps import make_train_step as _make_step
from meshfeed.train._train_state import TrainState

__all__ = ["create_state", "make_eval_fn", "make_train_step", "update_model"]

NNXLossFn = Callable[[Any, Batch], tuple[jax.Array, Mapping[str, jax.Array]]]
_TRAINING = {"deterministic": False, "use_running_average": False}
_EVALUATING = {"deterministic": True, "use_running_average": True}


class _Parts:
    """The model cut into graph, parameters, random keys and the rest (templates)."""

    def __init__(self, model: Any) -> None:
        if not isinstance(model, nnx.Module):
            raise TypeError(f"model is a {type(model).__name__}; pass a flax.nnx.Module.")
        _, params, self.keys, rest = nnx.split(model, nnx.Param, nnx.RngKey, ...)
        for template in (params, rest):
            pure = jax.tree.leaves(nnx.to_pure_dict(template))
            if any(a is not b for a, b in zip(pure, jax.tree.leaves(template), strict=True)):
                raise ValueError("this model's state does not flatten like its plain dict.")
        # Shapes, not buffers: a step that outlives the model's arrays keeps none alive.
        self.params, self.rest = _shapes(params), _shapes(rest)

    def fresh_keys(self, rng: jax.Array | None) -> Any:
        """One key per random stream for this step, or the model's own without ``rng``."""
        if rng is None:
            return self.keys
        leaves = jax.tree.leaves(self.keys)
        fresh = [jax.random.fold_in(rng, i) for i in range(len(leaves))]
        return jax.tree.unflatten(jax.tree.structure(self.keys), fresh)


def _shapes(state: Any) -> Any:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x)), state)


def _state(template: Any, values: Any, what: str) -> Any:
    """``values`` (a plain dict) as an ``nnx.State`` shaped like ``template``."""
    if jax.tree.structure(nnx.to_pure_dict(template)) != jax.tree.structure(values):
        raise ValueError(
            f"the state's {what} do not have this model's structure; build the state with "
            "meshfeed.flax.create_state(model, ...) from the same model class."
        )
    return jax.tree.unflatten(jax.tree.structure(template), jax.tree.leaves(values))


def _graphdef(model: Any, attributes: Mapping[str, Any], axis_name: Any) -> Any:
    """The model's graph with ``attributes`` set on every module that has them (and
    BatchNorm's ``axis_name``); the model itself is left as it was."""
    changed: list[tuple[Any, str, Any]] = []
    try:
        for _, module in nnx.iter_modules(model):
            wanted = dict(attributes)
            if isinstance(module, nnx.BatchNorm):
                wanted["axis_name"] = axis_name
            for name, value in wanted.items():
                if hasattr(module, name):
                    changed.append((module, name, getattr(module, name)))
                    setattr(module, name, value)
        return nnx.graphdef(model)
    finally:
        for module, name, value in reversed(changed):
            setattr(module, name, value)


def _placed(state: Any, mesh: Mesh) -> Any:
    """``state`` as a plain dict on ``mesh``, annotated variables in their layout."""
    specs = jax.tree.leaves(
        nnx.to_pure_dict(nnx.get_partition_spec(state)), is_leaf=lambda x: isinstance(x, P)
    )
    values = jax.tree.leaves(nnx.to_pure_dict(state))

    def one(value: Any, spec: Any) -> Any:
        if isinstance(getattr(value, "sharding", None), NamedSharding):
            return value  # the state takes the model's array itself
        if not isinstance(spec, P) or spec == P():
            return value  # TrainState.create replicates it
        return place_host(np.asarray(value), NamedSharding(mesh, spec))

    placed = [one(v, s) for v, s in zip(values, specs, strict=True)]
    return jax.tree.unflatten(jax.tree.structure(nnx.to_pure_dict(state)), placed)


def create_state(
    model: Any,
    optimizer: optax.GradientTransformation,
    *,
    mesh: Mesh,
    seed: int = 0,
    param_sharding: ParamSharding = None,
) -> TrainState:
    """The ``TrainState`` of ``model`` on ``mesh``: parameters, model state and a key.

    The state takes the model's values without copying them, and the model's variables
    are given the state's arrays (placed on the mesh), so each value is held once. A
    donating step (the default) deletes them: call ``update_model(model, state)`` to use
    the model again.

    Build the model under ``jax.set_mesh(mesh)`` (or with ``nnx.use_eager_sharding
    (False)``) when its variables carry sharding annotations; they keep those layouts.
    ``seed`` makes ``state.rng``, from which each step's dropout keys are drawn.
    ``param_sharding`` as for ``TrainState.create`` (``"fsdp"``: large parameters and
    their optimizer state split over the data axis too).
    """
    _Parts(model)  # refuses what is not an NNX model
    _, params, _, rest = nnx.split(model, nnx.Param, nnx.RngKey, ...)
    state = TrainState.create(
        _placed(params, mesh),
        optimizer,
        mesh=mesh,
        model_state=_placed(rest, mesh),
        rng=seed,
        param_sharding=param_sharding,
    )
    del params, rest
    # The model's variables now hold the state's arrays: the values exist once, and
    # whatever the model held before (arrays off the mesh) is freed with it.
    update_model(model, state)
    return state


def make_train_step(
    model: Any,
    loss_fn: NNXLossFn,
    optimizer: optax.GradientTransformation,
    *,
    mesh: Mesh,
    mode: Mode = "jit",
    batch_axes: Sequence[str] = (DATA,),
    donate: bool = True,
    microbatches: int = 1,
) -> StepFn:
    """``step(state, batch) -> (state, metrics)`` training ``model``'s values in a state.

    Args:
      model: the ``nnx.Module`` the state was made from (only its structure is used).
      loss_fn: ``loss_fn(model, batch) -> (loss, metrics)``: the mean loss over the
        valid rows (``meshfeed.masked_mean``) and a dict of scalar metrics; ``model`` is
        in training mode. A loss averaged over tokens returns their number as
        ``metrics["count"]``, as for ``meshfeed.make_train_step``.
      optimizer, mesh, mode, batch_axes, donate, microbatches: as for
        ``meshfeed.make_train_step``. With ``donate=True`` (the default) the first step
        takes the arrays ``create_state`` shares with ``model``: call ``update_model``
        before using the model again.
    """
    parts = _Parts(model)
    graph = _graphdef(model, _TRAINING, collective_axes(mode, batch_axes))

    def stateful_loss(params: Any, batch: Batch, model_state: Any, rng: Any) -> Any:
        merged = nnx.merge(
            graph,
            _state(parts.params, params, "params"),
            parts.fresh_keys(rng),
            _state(parts.rest, model_state, "model_state"),
        )
        out = loss_fn(merged, batch)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise TypeError(
                "loss_fn(model, batch) returns (loss, metrics), metrics a dict of scalars; "
                f"it returned {type(out).__name__}."
            )
        _, _, _, rest = nnx.split(merged, nnx.Param, nnx.RngKey, ...)
        return out[0], (out[1], nnx.to_pure_dict(rest))

    return _make_step(
        stateful_loss,
        optimizer,
        mesh=mesh,
        mode=mode,
        batch_axes=batch_axes,
        stateful=True,
        donate=donate,
        microbatches=microbatches,
    )


def make_eval_fn(model: Any, metrics_fn: Callable[[Any, Batch], Mapping[str, Any]]) -> EvalFn:
    """``eval_fn(params, batch, model_state)`` for ``meshfeed.fit``: ``metrics_fn(model,
    batch)`` (means over valid rows) with ``model`` in evaluation mode."""
    parts = _Parts(model)
    graph = _graphdef(model, _EVALUATING, None)

    def eval_fn(params: Any, batch: Batch, model_state: Any) -> Mapping[str, Any]:
        merged = nnx.merge(
            graph,
            _state(parts.params, params, "params"),
            parts.keys,
            _state(parts.rest, model_state, "model_state"),
        )
        return metrics_fn(merged, batch)

    return eval_fn


def update_model(model: Any, state: TrainState) -> None:
    """Writes ``state``'s parameters and model state into ``model``'s variables."""
    parts = _Parts(model)
    nnx.update(
        model,
        _state(parts.params, state.params, "params"),
        _state(parts.rest, state.model_state, "model_state"),
    )
