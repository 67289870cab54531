"""What every mode of a train step computes: the loss's gradient, keys, valid rows.

The loss is the mean over the *valid* rows of the global batch (``mask == True`` rows,
when the loader pads), or over what ``loss_fn`` says it counts (``metrics["count"]``,
e.g. its loss tokens). ``loss_fn`` returns the mean over the batch it is given --
``masked_mean`` does that for rows -- and ``_microbatches`` weights each part of a step
(a device's rows in the manual modes, a microbatch) by that count, so a device holding
only padding counts for nothing and the result equals the global mean exactly.
Auxiliary metrics are treated as means over the same count.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jax.typing import ArrayLike

from meshfeed.core._mesh import spec_axes
from meshfeed.feed._schedule import MASK

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
COUNT = "count"
"""The metric by which ``loss_fn`` says how many terms its mean is over (loss tokens):
the parts of a step (devices, microbatches) are then weighted by it."""


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


def gradient(loss_fn: LossFn, stateful: bool) -> Callable[..., Any]:
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


def step_key(rng: jax.Array | None, step: jax.Array, axes: Any = None) -> jax.Array | None:
    """This step's key: ``fold_in(rng, step)``, and the device's index along ``axes``."""
    if rng is None:
        return None
    key = jax.random.fold_in(rng, step)
    return key if axes is None else jax.random.fold_in(key, jax.lax.axis_index(axes))


def check_batch_specs(batch: Batch, mesh: Mesh, axes: tuple[str, ...], mode: str) -> dict:
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


def averaged(model_state: Any, count: jax.Array, total: jax.Array, axes: Any) -> Any:
    """Floating leaves averaged over the devices, weighted by valid rows; others kept."""

    def one(v: jax.Array) -> jax.Array:
        if not jnp.issubdtype(v.dtype, jnp.floating):
            return v
        return (jax.lax.psum(v * count, axes) / total).astype(v.dtype)

    return jax.tree.map(one, model_state)


def shardings_of(tree: Any) -> Any:
    return jax.tree.map(lambda x: x.sharding, tree)
