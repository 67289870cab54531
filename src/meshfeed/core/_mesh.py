"""Meshes, batch shardings, and which batch rows each device and process needs.

A batch is a set of global arrays whose first dimension is the batch dimension. A
`NamedSharding` splits that dimension over the mesh axes named in ``spec[0]`` and
replicates it over the others: the devices that share a coordinate on the batch axes
form a *replica group* and hold the same rows. Everything the loader reads follows from
the ``(batch axes, mesh)`` pair, which is why this module computes rows from the first
entry of the spec alone.

Where the devices sit matters as much as how many there are. ``make_mesh`` lays them out
as ``jax.make_mesh`` does for the machine (a TPU's torus, a GPU's device ids), and across
slices or hosts as ``create_hybrid_device_mesh`` does, with the axes named in ``dcn=`` on
the slow network between them: a data axis there sends one gradient reduction a step over
it, a model axis there would send every layer's activations. ``axes_across_processes``
says which axes a mesh sends between processes, for the plan to show.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeAlias

import jax
import numpy as np
from jax.experimental import mesh_utils
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
_PLURAL = {"slice": "slices", "process": "processes"}  # the granules of ``dcn=``


def make_mesh(
    *,
    axis_types: AxisTypes = "auto",
    devices: Sequence[Device] | None = None,
    dcn: str | Mapping[str, int] | None = None,
    **axis_sizes: int,
) -> Mesh:
    """Builds a mesh with the named axes, in the order given, laid out by the machine.

    Without ``devices=`` the devices are placed the way ``jax.make_mesh`` places them on
    this machine (on TPUs by the physical topology, on GPUs by device id, on CPUs in
    ``jax.devices()`` order). On several slices (TPU multislice) or hosts, ``dcn=`` names
    the axes that cross the slow network between them: each *granule* (a slice when the
    devices have distinct ``slice_index``, else a process) holds a contiguous block of the
    other axes, built with ``jax.experimental.mesh_utils.create_hybrid_device_mesh``.
    Put the data axis there: its only traffic is the gradient reduction once a step.

    The default axis type is **Auto**, unlike ``jax.make_mesh`` (Explicit since jax
    0.9): on Auto axes ``with_sharding_constraint`` reshards and matmuls need no
    ``out_sharding=``, which is what the data-parallel and hybrid recipes assume. Pass
    ``axis_types="explicit"`` for sharding-in-types.

    Args:
      axis_types: ``"auto"`` or ``"explicit"``, for every axis.
      devices: the devices, in mesh order (row-major over the axes), kept as given;
        default: every device, laid out by the topology. Pass a permutation to put
        replicas on other processes.
      dcn: the axes that cross slices or processes: an axis name (it takes every
        granule), or a mapping of axis name to the granules along it (their product
        is the number of granules, each divides its axis). Sizes stay the full axis
        sizes. Not with ``devices=``, which keeps its own order.
      **axis_sizes: axis name to size; one size may be ``-1`` for "the rest".

    Raises:
      ValueError: a size that is not a positive int (or ``-1`` once), sizes whose
        product is not the device count, devices on several slices without ``dcn=``,
        or a ``dcn=`` that names an unknown axis, does not divide its axis, does not
        multiply to the number of granules, or comes with ``devices=``.
      TypeError: ``dcn=`` neither an axis name nor a mapping.

    Example:
      >>> mesh = make_mesh(data=4, model=2)  # doctest: +SKIP
      >>> # 2 hosts of 4 devices: each host holds 2 data rows x 2 model columns.
      >>> mesh = make_mesh(data=4, model=2, dcn="data")  # doctest: +SKIP
      >>> axes_across_processes(mesh)  # doctest: +SKIP
      ('data',)
    """
    if not axis_sizes:
        raise ValueError("make_mesh needs at least one axis, e.g. make_mesh(data=8).")
    if axis_types not in _AXIS_TYPES:
        raise ValueError(f"axis_types={axis_types!r} is not one of {sorted(_AXIS_TYPES)}.")
    sizes = dict(axis_sizes)
    for name, size in sizes.items():
        if not isinstance(size, int) or isinstance(size, bool) or (size < 1 and size != -1):
            raise ValueError(f"mesh axis {name}={size!r} must be a positive int (or -1 once).")
    free = [name for name, size in sizes.items() if size == -1]
    if len(free) > 1:
        raise ValueError(f"only one mesh axis may be -1, got {free}.")
    wanted = _check_dcn(dcn, tuple(sizes))
    if dcn is not None and devices is not None:
        raise ValueError(
            "make_mesh takes dcn= or devices=, not both: devices= keeps the order given, "
            "dcn= lays out every device by slice or process; drop one of them."
        )
    listed = list(jax.devices() if devices is None else devices)
    fixed = math.prod(size for size in sizes.values() if size != -1)
    if free:
        if len(listed) % fixed:
            raise ValueError(
                f"{len(listed)} devices do not split into axes {sizes}; "
                f"make the fixed sizes divide {len(listed)}."
            )
        sizes[free[0]] = len(listed) // fixed
    if math.prod(sizes.values()) != len(listed):
        raise ValueError(
            f"mesh axes {sizes} hold {math.prod(sizes.values())} devices but there are "
            f"{len(listed)}; pass sizes whose product is {len(listed)}, or devices=."
        )
    shape, names = tuple(sizes.values()), tuple(sizes)
    kinds = (_AXIS_TYPES[axis_types],) * len(sizes)
    if devices is not None:
        return Mesh(np.asarray(listed, dtype=object).reshape(shape), names, axis_types=kinds)
    granule, groups = device_granules(listed)
    if wanted is None:
        if granule == "slice":
            raise ValueError(
                f"the devices are on {len(groups)} slices; pass dcn= with the axis that "
                f"crosses them, e.g. make_mesh(..., dcn={names[0]!r}), or devices=."
            )
        return jax.make_mesh(shape, names, axis_types=kinds, devices=listed)
    dcn_shape = _dcn_shape(wanted, sizes, len(groups), granule)
    counts = sorted({len(g) for g in groups})
    if len(counts) > 1:
        raise ValueError(
            f"the {len(groups)} {_PLURAL[granule]} hold {counts[0]} to {counts[-1]} devices; dcn= "
            "needs the same number on each: drop dcn= and pass devices= in mesh order."
        )
    ici_shape = tuple(s // d for s, d in zip(shape, dcn_shape, strict=True))
    # jax.make_mesh splits physical axes on these chips; do the same within a granule.
    split = listed[0].device_kind in ("TPU v5 lite", "TPU v5e")
    layout = mesh_utils.create_hybrid_device_mesh(
        ici_shape,
        dcn_shape,
        listed,
        process_is_granule=granule == "process",
        allow_split_physical_axes=split,
    )
    return Mesh(layout, names, axis_types=kinds)


def _check_dcn(dcn: object, names: tuple[str, ...]) -> dict[str, int | None] | None:
    """``dcn=`` as axis -> granules along it (None: every granule), its names checked."""
    if dcn is None:
        return None
    if isinstance(dcn, str):
        wanted: dict[str, int | None] = {dcn: None}
    elif isinstance(dcn, Mapping):
        wanted = dict(dcn)  # type: ignore[arg-type]
    else:
        raise TypeError(
            f"dcn is a {type(dcn).__name__}; pass an axis name (dcn={names[0]!r}) or a "
            f"mapping of axis name to granules (dcn={{{names[0]!r}: 2}})."
        )
    unknown = [a for a in wanted if a not in names]
    if unknown:
        raise ValueError(
            f"dcn= names {unknown}, not an axis of the mesh {names}; pass axes of the "
            f"mesh, e.g. dcn={names[0]!r}."
        )
    for axis, n in wanted.items():
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
            raise ValueError(f"dcn={{{axis!r}: {n!r}}} must be a positive int of granules.")
    return wanted


def _dcn_shape(
    wanted: Mapping[str, int | None], sizes: Mapping[str, int], granules: int, granule: str
) -> tuple[int, ...]:
    """The granules along each axis, in axis order, checked against sizes and granules."""
    dcn = {a: granules if n is None else n for a, n in wanted.items()}
    for axis, n in dcn.items():
        if sizes[axis] % n:
            raise ValueError(
                f"mesh axis {axis!r} of size {sizes[axis]} does not split over {n} "
                f"{_PLURAL[granule]} (dcn={{{axis!r}: {n}}}); make {axis}= a multiple of {n}, or "
                "spread the granules over more axes of dcn=."
            )
    if math.prod(dcn.values()) != granules:
        raise ValueError(
            f"dcn={dcn} spans {math.prod(dcn.values())} {_PLURAL[granule]} but the devices are on "
            f"{granules}; make the dcn= sizes multiply to {granules}, e.g. "
            f"dcn={{{next(iter(dcn))!r}: {granules}}}."
        )
    return tuple(dcn.get(a, 1) for a in sizes)


def device_granules(devices: Sequence[Device]) -> tuple[str, list[list[Device]]]:
    """The units of the slow network and their devices: ``("slice", ...)`` when the
    devices carry distinct ``slice_index`` (TPU multislice), else ``("process", ...)``;
    groups in key order, devices in the order given."""
    slices = {getattr(d, "slice_index", None) for d in devices}
    kind = "slice" if None not in slices and len(slices) > 1 else "process"
    groups: dict[int, list[Device]] = {}
    for d in devices:
        groups.setdefault(d.slice_index if kind == "slice" else d.process_index, []).append(d)
    return kind, [groups[k] for k in sorted(groups)]


def axes_across_processes(mesh: Mesh, *, processes: int | None = None) -> tuple[str, ...]:
    """The mesh axes that cross processes: those along which two devices, the same on
    every other axis, belong to different processes (their collectives leave the host).

    Args:
      mesh: the mesh.
      processes: as if the devices were split, in order, over this many processes
        (``process_map``); default: the processes running here.
    """
    owner = process_map(list(mesh.devices.flat), processes)
    grid = np.vectorize(owner.__getitem__, otypes=[np.int64])(mesh.devices)
    return tuple(
        name for axis, name in enumerate(mesh.axis_names) if np.any(np.diff(grid, axis=axis) != 0)
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
