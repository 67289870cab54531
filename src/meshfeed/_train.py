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

import dataclasses
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

from meshfeed._mesh import DATA, Device, spec_axes
from meshfeed._schedule import MASK
from meshfeed._shardings import place_host

Mode = Literal["jit", "shard_map", "pmap"]
MODES: tuple[Mode, ...] = ("jit", "shard_map", "pmap")
LossFn = Callable[[Any, Mapping[str, jax.Array]], tuple[jax.Array, Mapping[str, jax.Array]]]
Batch = Mapping[str, jax.Array]
_PMAP_AXIS = "devices"


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    """Parameters, optimizer state and the step count, placed on a mesh."""

    step: jax.Array
    params: Any
    opt_state: Any

    @classmethod
    def create(
        cls, params: Any, optimizer: optax.GradientTransformation, *, mesh: Mesh
    ) -> TrainState:
        """Places ``params`` on ``mesh`` and initialises the optimizer there.

        Leaves that are already ``jax.Array`` with a ``NamedSharding`` on ``mesh`` keep
        their layout (hybrid: place a kernel with ``P(None, 'model')`` first); all other
        leaves are replicated. Every process must pass the same values. The optimizer
        state follows the parameters' layout.
        """
        if not isinstance(mesh, Mesh):
            raise TypeError(f"mesh is a {type(mesh).__name__}; pass a jax.sharding.Mesh.")
        replicated = NamedSharding(mesh, P())
        params = jax.tree.map(lambda x: _place(x, mesh, replicated), params)
        # Leaves that do not derive from params (Adam's count) come out on one device.
        opt_state = jax.tree.map(
            lambda x: _place(x, mesh, replicated), jax.jit(optimizer.init)(params)
        )
        step = _place(np.zeros((), np.int32), mesh, replicated)
        return cls(step=step, params=params, opt_state=opt_state)


def _place(x: Any, mesh: Mesh, replicated: NamedSharding) -> jax.Array:
    sharding = getattr(x, "sharding", None)
    if isinstance(x, jax.Array) and isinstance(sharding, NamedSharding) and sharding.mesh == mesh:
        return x
    return place_host(np.asarray(x), replicated)


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


def make_train_step(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    *,
    mesh: Mesh,
    mode: Mode = "jit",
    batch_axes: Sequence[str] = (DATA,),
) -> Callable[[TrainState, Batch], tuple[TrainState, dict[str, jax.Array]]]:
    """Builds ``step(state, batch) -> (state, metrics)`` for one of three modes.

    Args:
      loss_fn: ``loss_fn(params, batch) -> (loss, aux)``: the mean loss over the valid
        rows of ``batch`` (see ``masked_mean``) and a dict of scalar metrics.
      optimizer: an optax ``GradientTransformation``.
      mesh: the mesh the batch and the state live on.
      mode: ``"jit"``, ``"shard_map"`` or ``"pmap"``.
      batch_axes: mesh axes the batch dimension is split over. ``"pmap"`` needs them to
        cover every device of the mesh (one batch shard per device).

    Returns:
      The step; ``metrics`` holds ``"loss"`` and the aux entries, replicated scalars.
      Each mode compiles once for a given batch shape.
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

    def apply(params: Any, opt_state: Any, grads: Any) -> tuple[Any, Any]:
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    if mode == "jit":
        return _jit_step(loss_fn, apply, mesh)
    if mode == "shard_map":
        return _shard_map_step(loss_fn, apply, mesh, axes)
    return _pmap_step(loss_fn, apply, mesh, axes)


def _jit_step(loss_fn: LossFn, apply: Callable[..., Any], mesh: Mesh) -> Any:
    def step_fn(state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch)
        params, opt_state = apply(state.params, state.opt_state, grads)
        return TrainState(state.step + 1, params, opt_state), {"loss": loss, **aux}

    compiled: dict[str, Any] = {}
    replicated = NamedSharding(mesh, P())

    def step(state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        if "fn" not in compiled:
            # Pin the state's layout so every step's output feeds the next without a
            # new compilation (XLA would otherwise be free to pick another layout).
            shardings = jax.tree.map(lambda x: x.sharding, state)
            compiled["fn"] = jax.jit(step_fn, out_shardings=(shardings, replicated))
        return compiled["fn"](state, batch)

    return step


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


def _local_step(
    loss_fn: LossFn, apply: Callable[..., Any], axes: tuple[str, ...]
) -> Callable[..., Any]:
    """The per-device step shared by shard_map and pmap: exact valid-row weighting."""

    def local(step: jax.Array, params: Any, opt_state: Any, batch: Batch) -> Any:
        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
        count = valid_rows(batch)
        total = jnp.maximum(jax.lax.psum(count, axes), 1.0)
        grads = _weighted(grads, count, total, axes)
        metrics = _weighted({"loss": loss, **aux}, count, total, axes)
        params, opt_state = apply(params, opt_state, grads)
        return step + 1, params, opt_state, metrics

    return local


def _shard_map_step(
    loss_fn: LossFn, apply: Callable[..., Any], mesh: Mesh, axes: tuple[str, ...]
) -> Any:
    local = _local_step(loss_fn, apply, axes)
    compiled: dict[Any, Any] = {}

    def step(state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        key = tuple(sorted(batch))
        if key not in compiled:
            specs = _check_batch_specs(batch, mesh, axes, "shard_map")
            # check_vma=False: the classic semantics, where each device's gradient is its
            # own and the psum below is the only reduction.
            mapped = jax.shard_map(
                local,
                mesh=mesh,
                in_specs=(P(), P(), P(), specs),
                out_specs=(P(), P(), P(), P()),
                check_vma=False,
            )
            compiled[key] = jax.jit(mapped)
        new_step, params, opt_state, metrics = compiled[key](
            state.step, state.params, state.opt_state, dict(batch)
        )
        return TrainState(new_step, params, opt_state), metrics

    return step


def _pmap_step(
    loss_fn: LossFn, apply: Callable[..., Any], mesh: Mesh, axes: tuple[str, ...]
) -> Any:
    local = _local_step(loss_fn, apply, (_PMAP_AXIS,))
    devices = _batch_device_order(mesh, axes)
    pmap_mesh = Mesh(np.asarray(devices, dtype=object), (_PMAP_AXIS,))
    per_device = NamedSharding(pmap_mesh, P(_PMAP_AXIS))
    pmap_replicated = NamedSharding(pmap_mesh, P())
    mapped = jax.pmap(
        local,
        axis_name=_PMAP_AXIS,
        in_axes=(None, None, None, 0),
        out_axes=None,
        devices=devices,
    )
    n = len(devices)

    @jax.jit
    def split(batch: Batch) -> dict[str, jax.Array]:
        out = {k: v.reshape(n, v.shape[0] // n, *v.shape[1:]) for k, v in batch.items()}
        return jax.lax.with_sharding_constraint(out, per_device)

    def step(state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        _check_batch_specs(batch, mesh, axes, "pmap")
        shardings = jax.tree.map(lambda x: x.sharding, state)
        inputs = _rewrap((state.step, state.params, state.opt_state), pmap_replicated)
        new_step, params, opt_state, metrics = mapped(*inputs, split(dict(batch)))
        new_state = TrainState(new_step, params, opt_state)
        replicated = NamedSharding(mesh, P())
        return _rewrap(new_state, shardings), _rewrap(metrics, replicated)

    return step


def _batch_device_order(mesh: Mesh, axes: tuple[str, ...]) -> list[Device]:
    """Mesh devices in the order of the batch shards they hold under ``P(axes)``."""
    order = [mesh.axis_names.index(a) for a in axes]
    return list(np.transpose(mesh.devices, order).reshape(-1))


def _rewrap(tree: Any, sharding: Any) -> Any:
    """Same buffers, another (equivalent) sharding: no copy, so no recompilation."""

    def one(x: jax.Array, s: NamedSharding) -> jax.Array:
        if x.sharding == s:
            return x
        by_device = {shard.device: shard.data for shard in x.addressable_shards}
        arrays = [by_device[d] for d in s.addressable_devices_indices_map(x.shape)]
        return jax.make_array_from_single_device_arrays(x.shape, s, arrays)

    if isinstance(sharding, NamedSharding):
        return jax.tree.map(lambda x: one(x, sharding), tree)
    return jax.tree.map(one, tree, sharding)
