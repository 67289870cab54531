"""``mode="pmap"``: the legacy idiom of the JAX guides, on a mesh's devices.

Parameters are broadcast with ``in_axes=None``, the batch reshaped to ``[devices,
device_batch_size, ...]``, gradients averaged with ``pmean``-style collectives over the
one axis of the devices, replicated outputs with ``out_axes=None``. A state whose leaves
are split (a kernel over ``'model'``, FSDP) goes in whole -- gathered on every device
-- and comes back in its own layout; its arrays are rewrapped, not copied, so nothing
recompiles from one step to the next.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from meshfeed.core._mesh import Device
from meshfeed.train._microbatches import local_step
from meshfeed.train._step_parts import (
    PMAP_AXIS,
    Batch,
    check_batch_specs,
    shardings_of,
)
from meshfeed.train._train_state import TrainState


def pmap_step(
    grads: Callable[..., Any],
    apply: Callable[..., Any],
    mesh: Mesh,
    axes: tuple[str, ...],
    donate: bool,
    microbatches: int = 1,
) -> Any:
    local = local_step(grads, apply, (PMAP_AXIS,), microbatches)
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
        check_batch_specs(batch, mesh, axes, "pmap")
        shardings = shardings_of(state)
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
