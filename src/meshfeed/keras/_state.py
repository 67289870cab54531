"""A Keras model's variables as a ``TrainState``, placed on a mesh, and back.

The state holds lists, as Keras' own stateless API does: ``state.params[i]`` is
``model.trainable_variables[i]``, ``state.model_state[i]`` is
``model.non_trainable_variables[i]``, ``state.opt_state[i]`` is a Keras optimizer's
``variables[i]``. Lists rather than dicts by ``variable.path`` because a path is not a
stable name: Keras numbers unnamed layers and seed generators per session
(``dense_1``, ``seed_generator_3``), so the same model built twice would have another
state structure, and a checkpoint would no longer restore into it.

Placement is ``TrainState.create``'s: each value is placed first with the sharding its
layout asks for (``place_host``, no cross-process ``device_put``) and ``create`` keeps
it. A Keras optimizer names each moment after the variable it belongs to
(``dense_kernel_momentum`` for ``dense/kernel``: ``add_variable_from_reference``), and
that name with the shape is how a moment finds its variable's layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import keras
import numpy as np
import optax
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from meshfeed.feed._shardings import place_host
from meshfeed.train._train_state import TrainState

Optimizer = Any
"""A ``keras.optimizers.Optimizer`` or an optax ``GradientTransformation``."""
_SEED_STATE = "seed_generator_state"  # the name Keras gives a SeedGenerator's variable


class Variables:
    """A built model's variables, in the order Keras' stateless calls take them."""

    def __init__(self, model: Any) -> None:
        if not isinstance(model, keras.Model):
            raise TypeError(f"model is a {type(model).__name__}; pass a keras.Model.")
        if not model.built or not model.trainable_variables:
            raise ValueError(
                "the model has no variables yet; build it first (start it with keras.Input, "
                "or call model.build(input_shape))."
            )
        self.model: Any = model  # Keras' annotations are too loose for a type checker
        self.trainable: list[Any] = list(model.trainable_variables)
        self.other: list[Any] = list(model.non_trainable_variables)
        self.seeds = [i for i, v in enumerate(self.other) if v.name == _SEED_STATE]

    def call(self, params: Any, model_state: Any, inputs: Any, *, rng: Any = None) -> Any:
        """``(y_pred, new model state, the model's own losses)``: in training mode, with
        the seed generators drawing from ``rng`` (this step's key), when it is given."""
        other = list(_checked(model_state, self.other, "model_state"))
        if rng is not None:
            for n, i in enumerate(self.seeds):
                bits = jax.random.bits(jax.random.fold_in(rng, n), (2,), jnp.uint32)
                other[i] = bits.astype(other[i].dtype)
        y_pred, other, losses = self.model.stateless_call(
            list(_checked(params, self.trainable, "params")),
            other,
            inputs,
            training=rng is not None,
            return_losses=True,
        )
        return y_pred, list(other), losses


def _checked(values: Any, variables: Sequence[Any], what: str) -> Sequence[Any]:
    """``values`` if they are one value per variable, each of its shape."""
    if (
        not isinstance(values, Sequence)
        or len(values) != len(variables)
        or any(tuple(a.shape) != tuple(v.shape) for a, v in zip(values, variables, strict=True))
    ):
        raise ValueError(
            f"the state's {what} do not match this model's variables; build the state with "
            "meshfeed.keras.create_state(model, ...) from this model (or the same "
            "architecture)."
        )
    return values


def transformation(
    optimizer: Optimizer, variables: Variables, first: Any = None
) -> optax.GradientTransformation:
    """``optimizer`` as ``TrainState`` and the steps run it. A Keras optimizer is built
    for the model if it is not yet; ``first``: its starting values and their shardings."""
    if isinstance(optimizer, optax.GradientTransformation):
        return optimizer
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            f"optimizer is a {type(optimizer).__name__}; pass a keras.optimizers.Optimizer "
            "(e.g. keras.optimizers.Adam(1e-3)) or an optax.GradientTransformation."
        )
    keras_optimizer: Any = optimizer
    if not keras_optimizer.built:
        keras_optimizer.build(variables.trainable)

    def init(params: Any) -> list[jax.Array]:
        if first is None:
            return [jnp.asarray(v.value) for v in keras_optimizer.variables]
        # Under TrainState.create's jit: each value laid out like the variable it follows.
        values, shardings = first
        return [
            jax.lax.with_sharding_constraint(jnp.asarray(v), s)
            for v, s in zip(values, shardings, strict=True)
        ]

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        if params is None:
            raise ValueError("a Keras optimizer's update needs params (stateless_apply).")
        new, state = keras_optimizer.stateless_apply(list(state), updates, params)
        return [n - p for n, p in zip(new, params, strict=True)], state

    return optax.GradientTransformation(init, update)


def _sharding(variable: Any, mesh: Mesh, layout_map: Any) -> NamedSharding:
    """One variable's sharding: from ``layout_map``, a set distribution, or replicated."""
    layout: Any = None
    if layout_map is not None:
        layout = layout_map[variable.path]
    else:
        distribution = keras.distribution.distribution()
        if isinstance(distribution, keras.distribution.ModelParallel):
            layout = distribution.get_variable_layout(variable)
    axes: tuple[Any, ...] = tuple(getattr(layout, "axes", ()) or ())
    unknown = [a for a in axes if a is not None and a not in mesh.axis_names]
    if unknown:
        raise ValueError(
            f"the layout of {variable.path} names mesh axes {unknown}, but the mesh has "
            f"{tuple(mesh.axis_names)}; build the LayoutMap on a DeviceMesh with the same "
            "axis names."
        )
    return NamedSharding(mesh, P(*axes))


def _follows(variable: Any, trainable: Sequence[Any], shardings: Sequence[Any], mesh: Mesh) -> Any:
    """An optimizer variable's sharding: that of the model variable it was made from
    (the longest path its name starts with, of its shape), else replicated."""
    same = [
        i
        for i, v in enumerate(trainable)
        if variable.name.startswith(v.path.replace("/", "_")) and v.shape == variable.shape
    ]
    if not same:
        return NamedSharding(mesh, P())
    return shardings[max(same, key=lambda i: len(trainable[i].path))]


def create_state(
    model: keras.Model,
    optimizer: Optimizer,
    *,
    mesh: Mesh,
    layout_map: keras.distribution.LayoutMap | None = None,
    seed: int = 0,
) -> TrainState:
    """The ``TrainState`` of a built Keras ``model`` on ``mesh``.

    ``state.params`` lists the values of ``model.trainable_variables``,
    ``state.model_state`` those of ``model.non_trainable_variables`` (batch-norm
    statistics, seed generators' state), in the model's order.

    Args:
      model: a built ``keras.Model`` (start it with ``keras.Input``, or call ``build``).
      optimizer: a ``keras.optimizers.Optimizer`` (built for the model here if it is
        not yet; its variables are the optimizer state) or an optax
        ``GradientTransformation``.
      mesh: the mesh the batches live on.
      layout_map: a ``keras.distribution.LayoutMap`` whose axis names are the mesh's,
        for model parallelism; default: a set ``ModelParallel`` distribution's layouts,
        else every variable replicated.
      seed: makes ``state.rng``, from which each step's dropout seeds are drawn.

    Example:
      >>> state = meshfeed.keras.create_state(  # doctest: +SKIP
      ...     model, keras.optimizers.Adam(1e-3), mesh=mesh, layout_map=layout_map)
    """
    variables = Variables(model)
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh is a {type(mesh).__name__}; pass a jax.sharding.Mesh.")
    if layout_map is not None and not isinstance(layout_map, keras.distribution.LayoutMap):
        raise TypeError(
            f"layout_map is a {type(layout_map).__name__}; pass a keras.distribution.LayoutMap."
        )
    transformation(optimizer, variables)  # refuses a wrong kind; builds a Keras one
    trainable = [_sharding(v, mesh, layout_map) for v in variables.trainable]
    other = [_sharding(v, mesh, layout_map) for v in variables.other]
    owned = optimizer.variables if isinstance(optimizer, keras.optimizers.Optimizer) else []
    groups = (variables.trainable, variables.other, owned)
    values = [[np.asarray(v.value) for v in group] for group in groups]
    if jax.process_count() > 1:
        # Replicas must start equal: every process takes process 0's initial values.
        values = jax.tree.map(np.asarray, multihost_utils.broadcast_one_to_all(values))
    first = (values[2], [_follows(v, variables.trainable, trainable, mesh) for v in owned])
    return TrainState.create(
        [place_host(x, s) for x, s in zip(values[0], trainable, strict=True)],
        transformation(optimizer, variables, first),
        mesh=mesh,
        model_state=[place_host(x, s) for x, s in zip(values[1], other, strict=True)],
        rng=seed,
    )


def update_model(
    model: keras.Model, state: TrainState, *, optimizer: Optimizer | None = None
) -> None:
    """Writes ``state``'s values into ``model``'s variables.

    Afterwards ``model.predict``, ``model.evaluate`` and ``model.save`` use the trained
    values. Given the Keras ``optimizer`` the state was made with, its variables are
    written too, so that ``model.fit`` would go on from them.
    """
    variables = Variables(model)
    params = _checked(state.params, variables.trainable, "params")
    model_state = _checked(state.model_state, variables.other, "model_state")
    pairs = [
        *zip(variables.trainable, params, strict=True),
        *zip(variables.other, model_state, strict=True),
    ]
    if optimizer is not None:
        transformation(optimizer, variables)
        owned = getattr(optimizer, "variables", None)
        if owned is None or len(owned) != len(state.opt_state):
            raise ValueError(
                "the state's opt_state is not this optimizer's variables; pass the Keras "
                "optimizer given to create_state, or no optimizer."
            )
        pairs += zip(owned, state.opt_state, strict=True)
    for variable, value in pairs:
        variable.assign(_to_host(value))


def _to_host(value: jax.Array) -> np.ndarray:
    if value.is_fully_addressable or value.is_fully_replicated:
        return np.asarray(value)
    return np.asarray(multihost_utils.process_allgather(value, tiled=True))
