"""The four ways to build one step's global ``jax.Array`` batch.

Every strategy is a ``Builder``: the row sets (positions in the global batch) a process
reads for one step, and a ``place`` that turns those rows, read and transformed, into
global arrays laid out by ``FieldShardings``. All return the same global values, bit for
bit. They differ in what each process reads and how the arrays are assembled:

``global``
    every process reads the whole global batch and keeps the slices of its own devices.
    Simple; reads ``process_count`` times more.
``per_device``
    one read per local device, of exactly that device's rows; replicas inside a
    process read the same rows again. A source of token rows that reads part of a row
    (``PartialRows``: ``context_layout``) reads each device only its own slice of them
    where the sharding splits their dimension 1 over a context axis, and no
    ``transform`` or ``record_transform`` needs the whole records.
``per_process``
    one read per process of the rows its devices need, each once, then each device's
    slice of them. On one process ``make_array_from_process_local_data`` would fall
    back to a ``device_put`` of the whole host array; slicing per device measured
    faster, so it places like ``global`` and differs from it only in what it reads.
``reshard``
    read in a layout with no replication at all (the batch split over every mesh
    axis, when the batch size allows), then move to the target layout inside the
    computation with ``meshfeed.reshard``.

The strategies guide's table names the JAX call each one builds with, and
``tests/feed/test_strategies.py`` holds that table to this code. No strategy uses a
cross-process ``device_put`` of host data: it compares the data across processes on
every call, which costs tens of milliseconds per step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding

from meshfeed.feed._plan import Strategy
from meshfeed.feed._schedule import MASK
from meshfeed.feed._shardings import (
    FieldShardings,
    SequenceCut,
    ShardingArg,
    fit_to_rank,
    place_host,
)

HostRows = list[dict[str, np.ndarray]]  # one dict per row set a builder reads


class Builder(NamedTuple):
    """One strategy: the row sets a process reads for a step, and how it places them.

    Reading (host work: the source, record transforms, ``transform``) and placing (the
    global ``jax.Array``) are separate so the Loader can read ahead on a background
    thread while it places on the consuming one. ``cuts`` (``per_device`` only) gives
    each row set its slice of the rows' sequence fields, for a ``SequenceCut``;
    ``place`` then takes those fields as read, cut already.
    """

    reads: Callable[[FieldShardings], list[np.ndarray]]
    place: Callable[[HostRows, FieldShardings, SequenceCut | None], dict[str, jax.Array]]
    cuts: Callable[[FieldShardings, SequenceCut], list[slice | None]] | None = None


def _global_shape(array: np.ndarray, global_batch_size: int) -> tuple[int, ...]:
    return (global_batch_size, *array.shape[1:])


def _reads_global(target: FieldShardings) -> list[np.ndarray]:
    return [np.arange(target.global_batch_size)]


def _place_global(
    data: HostRows, target: FieldShardings, cut: SequenceCut | None
) -> dict[str, jax.Array]:
    return {name: place_host(a, target.of(name, a.ndim)) for name, a in data[0].items()}


def _reads_per_device(target: FieldShardings) -> list[np.ndarray]:
    return [target.device_rows(device) for device in target.devices]


def _cuts_per_device(target: FieldShardings, cut: SequenceCut) -> list[slice | None]:
    return [cut.at.get(device) for device in target.devices]


def _place_per_device(
    data: HostRows, target: FieldShardings, cut: SequenceCut | None
) -> dict[str, jax.Array]:
    b = target.global_batch_size
    pieces: dict[str, list[jax.Array]] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for device, device_data in zip(target.devices, data, strict=True):
        rows = target.device_rows(device)
        cut_here = {} if cut is None or device not in cut.at else cut.shapes
        for name, array in device_data.items():
            sharding = target.of(name, array.ndim)
            block = target.field_device_rows(name).get(device)
            if block is None:
                continue
            whole = (b, *cut_here[name]) if name in cut_here else _global_shape(array, b)
            shape = shapes.setdefault(name, whole)
            index = sharding.addressable_devices_indices_map(shape)[device]
            assert index is not None
            local = array[np.searchsorted(rows, np.arange(block.start, block.stop))]
            if name in cut_here:  # read as this device's slice of each row already
                piece = local[(slice(None), slice(None), *index[2:])]
            else:
                piece = local[(slice(None), *index[1:])]
            pieces.setdefault(name, []).append(jax.device_put(piece, device))
    return {
        name: jax.make_array_from_single_device_arrays(
            shapes[name], target.of(name, len(shapes[name])), arrays
        )
        for name, arrays in pieces.items()
    }


def _reads_per_process(target: FieldShardings) -> list[np.ndarray]:
    return [target.process_rows]


def _place_per_process(
    data: HostRows, target: FieldShardings, cut: SequenceCut | None
) -> dict[str, jax.Array]:
    b = target.global_batch_size
    offsets = target.row_offsets
    out = {}
    for name, array in data[0].items():

        def local(index: Any, a: np.ndarray = array) -> np.ndarray:
            start, stop = index[0].indices(b)[:2]
            first = offsets[start]
            return a[(slice(first, first + stop - start), *index[1:])]

        out[name] = jax.make_array_from_callback(
            _global_shape(array, b), target.of(name, array.ndim), local
        )
    return out


BUILDERS: dict[Strategy, Builder] = {
    "global": Builder(_reads_global, _place_global),
    "per_device": Builder(_reads_per_device, _place_per_device, _cuts_per_device),
    "per_process": Builder(_reads_per_process, _place_per_process),
    # On the load shardings; the move happens in `reshard`.
    "reshard": Builder(_reads_per_process, _place_per_process),
}


def _explicit(sharding: NamedSharding) -> bool:
    return any(t == AxisType.Explicit for t in sharding.mesh.axis_types)


def reshard(batch: Mapping[str, jax.Array], sharding: ShardingArg) -> dict[str, jax.Array]:
    """Moves each array of ``batch`` to ``sharding`` (one for all, or one per field).

    Works inside and outside ``jax.jit``: ``with_sharding_constraint`` on Auto mesh
    axes, ``jax.sharding.reshard`` on Explicit ones. A sharding with more spec entries
    than a field has dimensions (such as the 1-D ``mask``) is cut to the field's rank.
    """
    out = {}
    for name, x in batch.items():
        if isinstance(sharding, NamedSharding):
            target = sharding
        elif name in sharding:
            target = sharding[name]
        elif name == MASK:
            target = next(iter(sharding.values()))
        else:
            raise ValueError(
                f"reshard got field {name!r} but the sharding mapping names only "
                f"{list(sharding)}; add {name!r} to it."
            )
        target = fit_to_rank(target, x.ndim)
        if _explicit(target):
            out[name] = jax.sharding.reshard(x, target)
        else:
            out[name] = jax.lax.with_sharding_constraint(x, target)
    return out
