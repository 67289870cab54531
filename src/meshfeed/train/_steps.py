"""Train steps: one builder, three ways to run the same data-parallel step.

``make_train_step(loss_fn, optimizer, mesh=..., mode=...)`` returns
``step(state, batch) -> (state, metrics)``. The three modes are the three idioms of the
JAX guides, and they give the same parameters:

``"jit"``
    automatic SPMD: ``jax.jit`` over the global batch as the loader laid it out, with the
    parameters replicated or sharded however the user placed them (hybrid data + model
    parallel: e.g. a kernel with ``P(None, 'model')``). ``loss_fn`` sees the global batch.
``"shard_map"``
    manual SPMD: ``jax.shard_map`` runs ``loss_fn`` and its gradient on each device's
    rows; gradients are combined with ``psum`` over the batch axes.
``"pmap"``
    the legacy idiom: parameters broadcast with ``in_axes=None``, the batch reshaped to
    ``[devices, device_batch_size, ...]``, gradients averaged with ``pmean``-style collectives,
    replicated outputs with ``out_axes=None``.

The loss is the mean over the *valid* rows of the global batch (``mask == True`` rows,
when the loader pads). ``loss_fn`` returns the mean over the valid rows of the batch it
is given -- ``meshfeed.masked_mean`` does that -- and the manual modes weight each
device's mean by its number of valid rows, so a device holding only padding counts for
nothing and the result equals the global mean exactly. Auxiliary metrics are treated as
means over valid rows too.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jax.typing import ArrayLike

from meshfeed.core._mesh import DATA, Device, spec_axes
from meshfeed.feed._schedule import MASK
from meshfeed.train._train_state import TrainState

Mode = Literal["jit", "shard_map", "pmap"]
"""How a train step runs: ``jit`` on the global batch, ``shard_map`` or ``pmap`` per device."""
MODES: tuple[Mode, ...] = ("jit", "shard_map", "pmap")
"""Every ``Mode``, in the order the docs list them."""
LossFn = Callable[..., tuple[jax.Array, Any]]
"""``loss_fn(params, batch) -> (loss, metrics)``; stateful: ``loss_fn(params, batch,
model_state, rng) -> (loss, (metrics, new_model_state))``."""
Batch = Mapping[str, jax.Array]
"""One step's batch: field name -> global ``jax.Array`` (as a ``Loader`` yields it)."""
PMAP_AXIS = "devices"
"""The name of the one axis of ``mode="pmap"``'s devices."""


def masked_mean(values: ArrayLike, batch: Mapping[str, ArrayLike]) -> jax.Array:
    """Mean of per-row ``values`` over the valid rows of ``batch`` (all rows if no mask).

    Safe on a batch with no valid row (returns 0), which a device can get from padding.
    """
    values = jnp.asarray(values)
    if MASK not in batch:
        return jnp.mean(values)
    mask = jnp.asarray(batch[MASK]).astype(values.dtype)
    mask = mask.reshape(mask.shape + (1,) * (values.ndim - mask.ndim))
    count = jnp.sum(jnp.broadcast_to(mask, values.shape))
    return jnp.sum(values * mask) / jnp.maximum(count, 1)


def valid_rows(batch: Batch) -> jax.Array:
    """The number of valid rows of ``batch`` (``mask`` True; every row without one)."""
    if MASK in batch:
        return jnp.sum(batch[MASK].astype(jnp.float32))
    leaf = next(iter(batch.values()))
    return jnp.asarray(leaf.shape[0], jnp.float32)


def collective_axes(mode: Mode, batch_axes: Sequence[str]) -> str | tuple[str, ...] | None:
    """The axis name that collectives over the batch use inside ``loss_fn`` in ``mode``.

    ``None`` under ``"jit"`` (``loss_fn`` sees the global batch); the batch axes under
    ``"shard_map"``; the one axis of the devices under ``"pmap"``. A BatchNorm that
    averages its statistics over this axis computes them on the global batch.
    """
    if mode == "jit":
        return None
    if mode == "pmap":
        return PMAP_AXIS
    axes = (batch_axes,) if isinstance(batch_axes, str) else tuple(batch_axes)
    return axes[0] if len(axes) == 1 else axes


def make_train_step(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    *,
    mesh: Mesh,
    mode: Mode = "jit",
    batch_axes: Sequence[str] = (DATA,),
    stateful: bool = False,
    donate: bool = True,
) -> Callable[[TrainState, Batch], tuple[TrainState, dict[str, jax.Array]]]:
    """Builds ``step(state, batch) -> (state, metrics)`` for one of three modes.

    Args:
      loss_fn: ``loss_fn(params, batch) -> (loss, aux)``: the mean loss over the valid
        rows of ``batch`` (see ``masked_mean``) and a dict of scalar metrics. With
        ``stateful=True``: ``loss_fn(params, batch, model_state, rng) ->
        (loss, (aux, new_model_state))``, where ``model_state`` and ``rng`` come from the
        ``TrainState`` (``rng`` is this step's key, ``None`` when the state has none).
      optimizer: an optax ``GradientTransformation``.
      mesh: the mesh the batch and the state live on.
      mode: ``"jit"``, ``"shard_map"`` or ``"pmap"``.
      batch_axes: mesh axes the batch dimension is split over. ``"pmap"`` needs them to
        cover every device of the mesh (one batch shard per device).
      stateful: ``loss_fn`` takes and returns model state and takes a key. In the
        manual modes each device gets its own key, and the floating-point leaves of the
        new model state are averaged over the batch axes weighted by valid rows (equal
        to ``jit``'s global statistics when ``loss_fn`` computes them with collectives
        over ``collective_axes(mode, batch_axes)``, and their average otherwise).
      donate: the step *donates* the state it is given: XLA writes the new parameters
        and optimizer state into the old ones' memory, so a step holds one copy of the
        state, not two, and after it the old state's arrays are deleted (reading one
        raises). Keep a state you still need with ``jax.tree.map(jnp.copy, state)``
        before the step, or pass ``donate=False``.

    Returns:
      The step; ``metrics`` holds ``"loss"`` and the aux entries, replicated scalars.
      The new state keeps the layout of the state passed in. Each mode compiles once
      for a given batch shape.
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is unknown; pass one of {list(MODES)}.")
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh is a {type(mesh).__name__}; pass a jax.sharding.Mesh.")
    axes = (batch_axes,) if isinstance(batch_axes, str) else tuple(batch_axes)
    missing = [a for a in axes if a not in mesh.axis_names]
    if not axes or missing:
        raise ValueError(
            f"batch_axes={axes} must name axes of the mesh {dict(mesh.shape)}; "
            f"{missing or 'none'} are not; pass e.g. batch_axes=('data',)."
        )
    if mode == "pmap" and math.prod(mesh.shape[a] for a in axes) != mesh.size:
        raise ValueError(
            f"mode='pmap' puts one batch shard on each device, but batch_axes={axes} "
            f"cover {math.prod(mesh.shape[a] for a in axes)} of the {mesh.size} devices of "
            f"mesh {dict(mesh.shape)}; pass batch_axes={tuple(mesh.axis_names)}, or use "
            "mode='jit' for hybrid data + model parallelism."
        )
    grads = _gradient(loss_fn, stateful)

    def apply(params: Any, opt_state: Any, grads: Any) -> tuple[Any, Any]:
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    if not isinstance(donate, bool):
        raise TypeError(f"donate={donate!r} must be True or False.")
    if mode == "jit":
        built = _jit_step(grads, apply, mesh, donate)
    elif mode == "shard_map":
        built = _shard_map_step(grads, apply, mesh, axes, donate)
    else:
        built = _pmap_step(grads, apply, mesh, axes, donate)

    def step(state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        if not stateful and (state.model_state is not None or state.rng is not None):
            raise ValueError(
                "the state holds model_state or rng, which loss_fn(params, batch) cannot "
                "see; pass stateful=True and write loss_fn(params, batch, model_state, rng)"
                " -> (loss, (metrics, new_model_state))."
            )
        return built(state, batch)

    return step


def _gradient(loss_fn: LossFn, stateful: bool) -> Callable[..., Any]:
    """``(params, batch, model_state, rng) -> (loss, aux, model_state, grads)``."""

    def stateless(params: Any, batch: Batch, model_state: Any, rng: Any) -> Any:
        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
        return loss, aux, model_state, grads

    def with_state(params: Any, batch: Batch, model_state: Any, rng: Any) -> Any:
        def inner(p: Any) -> Any:
            out = loss_fn(p, batch, model_state, rng)  # type: ignore[call-arg]
            if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], tuple)):
                raise TypeError(
                    "with stateful=True, loss_fn(params, batch, model_state, rng) returns "
                    "(loss, (metrics, new_model_state)); it returned "
                    f"{type(out).__name__} {jax.tree.structure(out)}."
                )
            return out

        (loss, (aux, new_state)), grads = jax.value_and_grad(inner, has_aux=True)(params)
        return loss, aux, new_state, grads

    return with_state if stateful else stateless


def _step_key(rng: jax.Array | None, step: jax.Array, axes: Any = None) -> jax.Array | None:
    """This step's key: ``fold_in(rng, step)``, and the device's index along ``axes``."""
    if rng is None:
        return None
    key = jax.random.fold_in(rng, step)
    return key if axes is None else jax.random.fold_in(key, jax.lax.axis_index(axes))


def _jit_step(
    grads: Callable[..., Any], apply: Callable[..., Any], mesh: Mesh, donate: bool
) -> Any:
    def step_fn(state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        key = _step_key(state.rng, state.step)
        loss, aux, model_state, g = grads(state.params, batch, state.model_state, key)
        params, opt_state = apply(state.params, state.opt_state, g)
        new = TrainState(state.step + 1, params, opt_state, model_state, state.rng)
        return new, {"loss": loss, **aux}

    compiled: dict[str, Any] = {}
    replicated = NamedSharding(mesh, P())

    def step(state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        if "fn" not in compiled:
            # Pin the state's layout so every step's output feeds the next without a
            # new compilation (XLA would otherwise be free to pick another layout).
            compiled["fn"] = jax.jit(
                step_fn,
                out_shardings=(_shardings(state), replicated),
                donate_argnums=(0,) if donate else (),
            )
        return compiled["fn"](state, batch)

    return step


def _shardings(tree: Any) -> Any:
    return jax.tree.map(lambda x: x.sharding, tree)


def _check_batch_specs(batch: Batch, mesh: Mesh, axes: tuple[str, ...], mode: str) -> dict:
    specs = {}
    for name, x in batch.items():
        sharding = x.sharding
        spec = sharding.spec if isinstance(sharding, NamedSharding) else None
        if (
            spec is None
            or sharding.mesh != mesh  # type: ignore[union-attr]
            or not len(spec)
            or spec_axes(spec[0]) != axes
            or any(entry is not None for entry in tuple(spec)[1:])
        ):
            raise ValueError(
                f"mode={mode!r} needs every batch field split over batch_axes={axes} on "
                f"its first dimension only, on the step's mesh; field {name!r} has "
                f"{sharding}. Load with sharding=NamedSharding(mesh, P({axes!r})), or use "
                "mode='jit'."
            )
        specs[name] = P(spec[0])
    return specs


def _weighted(tree: Any, count: jax.Array, total: jax.Array, axes: tuple[str, ...]) -> Any:
    return jax.tree.map(lambda v: jax.lax.psum(v * count, axes) / total, tree)


def _averaged(model_state: Any, count: jax.Array, total: jax.Array, axes: Any) -> Any:
    """Floating leaves averaged over the devices, weighted by valid rows; others kept."""

    def one(v: jax.Array) -> jax.Array:
        if not jnp.issubdtype(v.dtype, jnp.floating):
            return v
        return (jax.lax.psum(v * count, axes) / total).astype(v.dtype)

    return jax.tree.map(one, model_state)


def _local_step(
    grads: Callable[..., Any], apply: Callable[..., Any], axes: tuple[str, ...]
) -> Callable[..., Any]:
    """The per-device step shared by shard_map and pmap: exact valid-row weighting."""

    def local(
        step: jax.Array, params: Any, opt_state: Any, model_state: Any, rng: Any, batch: Batch
    ) -> Any:
        loss, aux, model_state, g = grads(params, batch, model_state, _step_key(rng, step, axes))
        count = valid_rows(batch)
        total = jnp.maximum(jax.lax.psum(count, axes), 1.0)
        g = _weighted(g, count, total, axes)
        metrics = _weighted({"loss": loss, **aux}, count, total, axes)
        model_state = _averaged(model_state, count, total, axes)
        params, opt_state = apply(params, opt_state, g)
        return step + 1, params, opt_state, model_state, metrics

    return local


def _shard_map_step(
    grads: Callable[..., Any],
    apply: Callable[..., Any],
    mesh: Mesh,
    axes: tuple[str, ...],
    donate: bool,
) -> Any:
    local = _local_step(grads, apply, axes)
    compiled: dict[Any, Any] = {}
    replicated = NamedSharding(mesh, P())

    def step(state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        key = tuple(sorted(batch))
        if key not in compiled:
            specs = _check_batch_specs(batch, mesh, axes, "shard_map")
            # check_vma=False: the classic semantics, where each device's gradient is its
            # own and the psum below is the only reduction.
            mapped = jax.shard_map(
                local,
                mesh=mesh,
                in_specs=(P(), P(), P(), P(), P(), specs),
                out_specs=(P(), P(), P(), P(), P()),
                check_vma=False,
            )
            # Parameters enter whole; the outputs go back to the state's layout (a
            # kernel over 'model' stays over 'model').
            kept = _shardings((state.step, state.params, state.opt_state, state.model_state))
            # The key is not donated: the new state keeps it (each step folds in its number).
            compiled[key] = jax.jit(
                mapped,
                out_shardings=(*kept, replicated),
                donate_argnums=(0, 1, 2, 3) if donate else (),
            )
        new_step, params, opt_state, model_state, metrics = compiled[key](
            state.step, state.params, state.opt_state, state.model_state, state.rng, dict(batch)
        )
        return TrainState(new_step, params, opt_state, model_state, state.rng), metrics

    return step


def _pmap_step(
    grads: Callable[..., Any],
    apply: Callable[..., Any],
    mesh: Mesh,
    axes: tuple[str, ...],
    donate: bool,
) -> Any:
    local = _local_step(grads, apply, (PMAP_AXIS,))
    devices = _batch_device_order(mesh, axes)
    pmap_mesh = Mesh(np.asarray(devices, dtype=object), (PMAP_AXIS,))
    per_device = NamedSharding(pmap_mesh, P(PMAP_AXIS))
    pmap_replicated = NamedSharding(pmap_mesh, P())
    mapped = jax.pmap(
        local,
        axis_name=PMAP_AXIS,
        in_axes=(None, None, None, None, None, 0),
        out_axes=None,
        devices=devices,
        donate_argnums=(0, 1, 2, 3) if donate else (),
    )
    n = len(devices)

    @jax.jit
    def split(batch: Batch) -> dict[str, jax.Array]:
        out = {k: v.reshape(n, v.shape[0] // n, *v.shape[1:]) for k, v in batch.items()}
        return jax.lax.with_sharding_constraint(out, per_device)

    def step(state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        _check_batch_specs(batch, mesh, axes, "pmap")
        shardings = _shardings(state)
        parts = (state.step, state.params, state.opt_state, state.model_state)
        inputs = _rewrap(_gathered(parts), pmap_replicated)
        rng = state.rng
        if rng is not None:  # keys have no buffers to rewrap: their bits do
            bits = _rewrap(jax.random.key_data(rng), pmap_replicated)
            rng = jax.random.wrap_key_data(bits, impl=jax.random.key_impl(rng))
        new_step, params, opt_state, model_state, metrics = mapped(*inputs, rng, split(dict(batch)))
        if donate:  # a split leaf went in as a whole copy: the copy was donated, not it
            for leaf in jax.tree.leaves(parts):
                if not leaf.is_deleted():
                    leaf.delete()
        new_state = TrainState(new_step, params, opt_state, model_state, state.rng)
        replicated = NamedSharding(mesh, P())
        return _rewrap(new_state, shardings), _rewrap(metrics, replicated)

    return step


def _batch_device_order(mesh: Mesh, axes: tuple[str, ...]) -> list[Device]:
    """Mesh devices in the order of the batch shards they hold under ``P(axes)``."""
    order = [mesh.axis_names.index(a) for a in axes]
    return list(np.transpose(mesh.devices, order).reshape(-1))


def _rewrap(tree: Any, sharding: Any) -> Any:
    """Same buffers, another sharding: no copy, so no recompilation.

    Each leaf is laid out like its target or replicated; a replicated leaf going to a
    split target (pmap's output for a kernel over 'model') is sliced on each device.
    """

    def one(x: jax.Array, s: NamedSharding) -> jax.Array:
        if x.sharding == s:
            return x
        by_device = {shard.device: shard.data for shard in x.addressable_shards}
        arrays = []
        for device, index in s.addressable_devices_indices_map(x.shape).items():
            part = by_device[device]
            whole = x.sharding.is_fully_replicated and not s.is_fully_replicated
            arrays.append(part[index] if whole else part)
        return jax.make_array_from_single_device_arrays(x.shape, s, arrays)

    if isinstance(sharding, NamedSharding):
        return jax.tree.map(lambda x: one(x, sharding), tree)
    return jax.tree.map(one, tree, sharding)


def _gathered(tree: Any) -> Any:
    """``tree`` with every split leaf made whole on every device of its mesh."""

    def one(x: jax.Array) -> jax.Array:
        if x.sharding.is_fully_replicated:
            return x
        return _replicator(x.sharding.mesh)(x)  # type: ignore[attr-defined]

    return jax.tree.map(one, tree)


@functools.cache
def _replicator(mesh: Mesh) -> Callable[[jax.Array], jax.Array]:
    # A collective under jit: device_put between hosts is not supported on every backend.
    return jax.jit(lambda v: v, out_shardings=NamedSharding(mesh, P()))
