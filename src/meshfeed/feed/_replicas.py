"""Replica checks: do all devices that should hold the same block really hold it?

Nothing in JAX checks this for data that enters through
``make_array_from_process_local_data`` or callbacks: two processes that load different
rows for the same replica group produce an array that is silently inconsistent. The
check here is a collective: every device compares its block with the other members of
its replica group (``pmax != pmin`` over the mesh axes that replicate the array, on the
bits, so NaNs compare equal), and the per-device verdicts are gathered so that every
process knows which devices differ and raises the same error.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from meshfeed.core._mesh import Device, spec_axes


def _as_bits(x: jax.Array) -> jax.Array:
    if jnp.issubdtype(x.dtype, jnp.floating):
        width = jnp.dtype(x.dtype).itemsize
        x = jax.lax.bitcast_convert_type(x, {2: jnp.int16, 4: jnp.int32, 8: jnp.int64}[width])
    if x.dtype == jnp.bool_ or jnp.dtype(x.dtype).itemsize < 4:
        x = x.astype(jnp.int32)
    return x


@functools.lru_cache(maxsize=256)
def _mismatch_fn(mesh: Mesh, spec: P, replicated: tuple[str, ...]) -> Callable[..., Any]:
    every = tuple(mesh.axis_names)

    def local(block: jax.Array) -> jax.Array:
        bits = _as_bits(block)
        differs = jnp.any(jax.lax.pmax(bits, replicated) != jax.lax.pmin(bits, replicated))
        return differs.astype(jnp.int32).reshape((1,) * len(every))

    # One verdict per device (out_specs over every axis), then gathered to all devices.
    mapped = jax.shard_map(local, mesh=mesh, in_specs=spec, out_specs=P(*every), check_vma=False)
    return jax.jit(mapped, out_shardings=NamedSharding(mesh, P()))


def mismatched_devices(x: jax.Array) -> list[list[Device]]:
    """Replica groups of ``x`` whose members do not all hold the same data."""
    sharding = x.sharding
    if not isinstance(sharding, NamedSharding):
        raise TypeError(
            f"check_replicas needs arrays with a NamedSharding, got {type(sharding).__name__}."
        )
    mesh, spec = sharding.mesh, sharding.spec
    used = {a for entry in spec for a in spec_axes(entry)}
    replicated = tuple(a for a in mesh.axis_names if a not in used)
    if not replicated:
        return []
    verdicts = np.asarray(_mismatch_fn(mesh, spec, replicated)(x))
    flagged = [
        d for d, bad in zip(np.asarray(mesh.devices).flat, verdicts.flat, strict=True) if bad
    ]
    groups: dict[Any, list[Device]] = {}
    index_map = sharding.devices_indices_map(tuple(x.shape))
    for device in flagged:
        key = tuple((s.start, s.stop) for s in index_map[device])
        groups.setdefault(key, []).append(device)
    return list(groups.values())


def check_replicas(batch: Mapping[str, jax.Array] | jax.Array) -> None:
    """Raises ``ValueError`` if any replica group of any array holds differing data.

    A collective: call it on every process, with the same arrays in the same order. It
    compares the data itself, across processes, not how it was built.

    Raises:
      ValueError: naming the array, the devices and the processes that disagree.
    """
    arrays = batch if isinstance(batch, Mapping) else {"array": batch}
    problems = []
    for name, x in arrays.items():
        for group in mismatched_devices(x):
            index = x.sharding.devices_indices_map(tuple(x.shape))[group[0]]
            where = ", ".join(
                f"{s.start or 0}:{s.stop if s.stop is not None else n}"
                for s, n in zip(index, x.shape, strict=True)
            )
            problems.append(
                f"{name!r} block [{where}]: devices {[d.id for d in group]} on processes "
                f"{sorted({d.process_index for d in group})} hold different data"
            )
    if problems:
        raise ValueError(
            "replicas differ: " + "; ".join(problems) + ". Every process must load the same "
            "rows for devices that replicate them; build global arrays with meshfeed.Loader, "
            "or pass make_array_from_process_local_data the same data on those processes."
        )
