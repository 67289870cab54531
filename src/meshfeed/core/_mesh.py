"""Meshes, batch shardings, and which batch rows each device and process needs.

A batch is a set of global arrays whose first dimension is the batch dimension. A
`NamedSharding` splits that dimension over the mesh axes named in ``spec[0]`` and
replicates it over the others: the devices that share a coordinate on the batch axes
form a *replica group* and hold the same rows. Everything the loader reads follows from
the ``(batch axes, mesh)`` pair, which is why this module computes rows from the first
entry of the spec alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal, TypeAlias

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

# jax.Device is a plain assignment in jax/__init__, which type checkers cannot use.
Device: TypeAlias = Any

DATA = "data"
"""The name of the data-parallel mesh axis that ``make_mesh`` and ``batch_sharding``
use by default."""
MODEL = "model"
"""The name of the model-parallel mesh axis in meshfeed's examples."""
CONTEXT = "context"
"""The name of the context axis (a row's tokens split over it) in meshfeed's examples."""

AxisTypes = Literal["auto", "explicit"]
"""The kind of mesh axes ``make_mesh`` makes: JAX's ``Auto`` (the default here) or
``Explicit`` (sharding in types)."""
_AXIS_TYPES: dict[str, AxisType] = {"auto": AxisType.Auto, "explicit": AxisType.Explicit}


def make_mesh(
    *,
    axis_types: AxisTypes = "auto",
    devices: Sequence[Device] | None = None,
    **axis_sizes: int,
) -> Mesh:
    """Builds a mesh with the named axes, in the order given.

    The default axis type is **Auto**, unlike ``jax.make_mesh`` (Explicit since jax
    0.9): on Auto axes ``with_sharding_constraint`` reshards and matmuls need no
    ``out_sharding=``, which is what the data-parallel and hybrid recipes assume. Pass
    ``axis_types="explicit"`` for sharding-in-types.

    Args:
      axis_types: ``"auto"`` or ``"explicit"``, for every axis.
      devices: the devices, in mesh order (row-major over the axes); default
        ``jax.devices()``. Pass a permutation to put replicas on other processes.
      **axis_sizes: axis name to size; one size may be ``-1`` for "the rest".

    Example:
      >>> mesh = make_mesh(data=4, model=2)  # doctest: +SKIP
    """
    if not axis_sizes:
        raise ValueError("make_mesh needs at least one axis, e.g. make_mesh(data=8).")
    if axis_types not in _AXIS_TYPES:
        raise ValueError(f"axis_types={axis_types!r} is not one of {sorted(_AXIS_TYPES)}.")
    devices = list(jax.devices() if devices is None else devices)
    sizes = dict(axis_sizes)
    for name, size in sizes.items():
        if not isinstance(size, int) or isinstance(size, bool) or (size < 1 and size != -1):
            raise ValueError(f"mesh axis {name}={size!r} must be a positive int (or -1 once).")
    free = [name for name, size in sizes.items() if size == -1]
    if len(free) > 1:
        raise ValueError(f"only one mesh axis may be -1, got {free}.")
    fixed = math.prod(size for size in sizes.values() if size != -1)
    if free:
        if len(devices) % fixed:
            raise ValueError(
                f"{len(devices)} devices do not split into axes {sizes}; "
                f"make the fixed sizes divide {len(devices)}."
            )
        sizes[free[0]] = len(devices) // fixed
    if math.prod(sizes.values()) != len(devices):
        raise ValueError(
            f"mesh axes {sizes} hold {math.prod(sizes.values())} devices but there are "
            f"{len(devices)}; pass sizes whose product is {len(devices)}, or devices=."
        )
    kind = _AXIS_TYPES[axis_types]
    return Mesh(
        np.asarray(devices, dtype=object).reshape(tuple(sizes.values())),
        tuple(sizes),
        axis_types=(kind,) * len(sizes),
    )


def batch_sharding(mesh: Mesh, axes: str | Sequence[str] = (DATA,)) -> NamedSharding:
    """``NamedSharding(mesh, P(axes))``: the batch dimension split over ``axes``.

    Other dimensions are replicated, and so is the batch over mesh axes not in ``axes``.
    """
    names = (axes,) if isinstance(axes, str) else tuple(axes)
    missing = [a for a in names if a not in mesh.axis_names]
    if missing:
        raise ValueError(
            f"batch_sharding axes={names} names {missing}, not an axis of the mesh "
            f"{dict(mesh.shape)}; pass axes from {tuple(mesh.axis_names)}."
        )
    return NamedSharding(mesh, P(names if len(names) != 1 else names[0]))


def spec_axes(entry: object) -> tuple[str, ...]:
    """The mesh axes named by one entry of a ``PartitionSpec``."""
    if entry is None:
        return ()
    if isinstance(entry, str):
        return (entry,)
    return tuple(entry)  # type: ignore[arg-type]


def batch_axes(sharding: NamedSharding) -> tuple[str, ...]:
    """The mesh axes that split the batch (first) dimension."""
    spec = sharding.spec
    return spec_axes(spec[0]) if len(spec) else ()


def num_batch_shards(sharding: NamedSharding) -> int:
    """How many distinct row blocks the batch dimension is cut into."""
    return math.prod(sharding.mesh.shape[a] for a in batch_axes(sharding))


def _row_sharding(sharding: NamedSharding) -> NamedSharding:
    return NamedSharding(sharding.mesh, P(sharding.spec[0] if len(sharding.spec) else None))


def device_rows(sharding: NamedSharding, global_batch_size: int) -> dict[Device, slice]:
    """The batch rows each addressable device of ``sharding`` holds."""
    index_map = _row_sharding(sharding).addressable_devices_indices_map((global_batch_size,))
    rows = {}
    for device, index in index_map.items():
        assert index is not None
        rows[device] = slice(*index[0].indices(global_batch_size)[:2])
    return rows


def process_rows(sharding: NamedSharding, global_batch_size: int) -> np.ndarray:
    """Sorted batch rows this process's devices hold, each once (replicas deduplicated)."""
    blocks = {(s.start, s.stop) for s in device_rows(sharding, global_batch_size).values()}
    if not blocks:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.arange(a, b) for a, b in sorted(blocks)]).astype(np.int64)


def process_map(devices: Sequence[Device], processes: int | None) -> dict[Device, int]:
    """Each device's process: the real one, or with ``processes=N`` the devices split,
    in order, into N equal groups (to plan for a process count not running here)."""
    if processes is None:
        return {d: d.process_index for d in devices}
    ordered = sorted(devices, key=lambda d: (d.process_index, d.id))
    if processes < 1 or len(ordered) % processes:
        raise ValueError(f"processes={processes} must divide the {len(ordered)} devices evenly.")
    per = len(ordered) // processes
    return {d: i // per for i, d in enumerate(ordered)}


def check_sharding(
    sharding: object,
    *,
    name: str,
    global_batch_size: int,
    shape: Sequence[int] | None,
) -> NamedSharding:
    """Validates one field's sharding against the batch size and the field's shape.

    Args:
      sharding: what the user passed.
      name: the field, for the message.
      global_batch_size: rows of one step.
      shape: the per-example shape, or None when not yet known.
    """
    if not isinstance(sharding, NamedSharding):
        raise TypeError(
            f"sharding for field {name!r} is a {type(sharding).__name__}; pass a "
            "jax.sharding.NamedSharding, e.g. meshfeed.batch_sharding(mesh, ('data',))."
        )
    mesh = sharding.mesh
    for entry in sharding.spec:
        for axis in spec_axes(entry):
            if axis not in mesh.axis_names:
                raise ValueError(
                    f"sharding for field {name!r} names mesh axis {axis!r}, but the mesh "
                    f"has axes {tuple(mesh.axis_names)}; fix the PartitionSpec."
                )
    shards = num_batch_shards(sharding)
    if global_batch_size % shards:
        axes = batch_axes(sharding)
        raise ValueError(
            f"global_batch_size={global_batch_size} is not divisible by the {shards} devices "
            f"on mesh axes {axes} (field {name!r}); pass a multiple of {shards}, or a mesh "
            f"with fewer {axes} devices."
        )
    if shape is not None:
        if len(sharding.spec) > 1 + len(shape):
            raise ValueError(
                f"sharding for field {name!r} has spec {sharding.spec} with "
                f"{len(sharding.spec)} entries but the field has {1 + len(shape)} "
                f"dimensions (batch + {tuple(shape)}); shorten the PartitionSpec."
            )
        for dim, entry in enumerate(tuple(sharding.spec)[1:], start=1):
            parts = math.prod(mesh.shape[a] for a in spec_axes(entry))
            if shape[dim - 1] % parts:
                raise ValueError(
                    f"field {name!r} has size {shape[dim - 1]} in dimension {dim}, not "
                    f"divisible by the {parts} devices of mesh axes {spec_axes(entry)}; "
                    f"pad that dimension to a multiple of {parts}, or do not shard it."
                )
    return sharding
