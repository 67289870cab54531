"""The four ways to build one step's global ``jax.Array`` batch.

Every strategy is a ``Builder``: the row sets (positions in the global batch) a process
reads for one step, and a ``place`` that turns those rows, read and transformed, into
global arrays laid out by a ``Layout``. All return the same global values, bit for bit.
They differ in what each process reads and how the arrays are assembled:

``global``
    every process reads the whole global batch and keeps the slices of its own
    devices (``make_array_from_callback``). Simple; reads ``process_count`` times more.
``per_device``
    one read per local device, of exactly that device's rows; replicas inside a
    process read the same rows again (``make_array_from_single_device_arrays``).
``per_process``
    one read per process of the rows its devices need, each once, then
    ``make_array_from_process_local_data`` with an explicit ``global_shape``.
``reshard``
    read in a layout with no replication at all (the batch split over every mesh
    axis, when the batch size allows), then move to the target layout inside the
    computation with ``meshfeed.reshard``.

No strategy uses a cross-process ``device_put`` of host data: it compares the data
across processes on every call, which costs tens of milliseconds per step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, NamedTuple

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from meshfeed._mesh import Device, batch_axes, device_rows, process_rows
from meshfeed._plan import load_sharding

Strategy = Literal["global", "per_device", "per_process", "reshard", "auto"]
STRATEGIES: tuple[Strategy, ...] = ("global", "per_device", "per_process", "reshard", "auto")
MASK = "mask"

ShardingArg = NamedSharding | Mapping[str, NamedSharding]


def fit_to_rank(sharding: NamedSharding, ndim: int) -> NamedSharding:
    """Drops spec entries past ``ndim`` so one sharding can serve a lower-rank field."""
    if len(sharding.spec) <= ndim:
        return sharding
    return NamedSharding(sharding.mesh, P(*tuple(sharding.spec)[:ndim]))


class Layout:
    """Where each field of a batch goes: one sharding for all, or one per field.

    The ``mask`` field, when not named, takes the batch dimension of the first sharding.
    """

    def __init__(self, sharding: ShardingArg, global_batch_size: int) -> None:
        self.global_batch_size = global_batch_size
        if isinstance(sharding, NamedSharding):
            self._default: NamedSharding | None = sharding
            self._by_field: dict[str, NamedSharding] = {}
        else:
            self._default = None
            self._by_field = dict(sharding)
        first = self._default or next(iter(self._by_field.values()))
        self._mask = self._by_field.get(MASK, fit_to_rank(first, 1))
        shardings = [*self._by_field.values(), self._mask]
        if self._default is not None:
            shardings.append(self._default)
        self._device_rows: dict[Any, dict[Device, slice]] = {}
        self._process_rows: dict[Any, np.ndarray] = {}
        for s in shardings:
            key = _row_key(s)
            if key not in self._process_rows:
                self._device_rows[key] = device_rows(s, global_batch_size)
                self._process_rows[key] = process_rows(s, global_batch_size)
        self.rows = np.unique(np.concatenate(list(self._process_rows.values())))
        # Where each row block starts in the process's rows: local data is their union.
        self.row_offsets = {int(r): i for i, r in enumerate(self.rows)}
        self.devices = sorted(
            {d for rows in self._device_rows.values() for d in rows}, key=lambda d: d.id
        )

    def sharding(self, field: str, ndim: int) -> NamedSharding:
        if field == MASK:
            return self._mask
        s = self._by_field.get(field, self._default)
        if s is None:
            raise ValueError(
                f"the batch has field {field!r} but the sharding mapping names only "
                f"{list(self._by_field)}; add {field!r} to it."
            )
        return fit_to_rank(s, ndim)

    def device_field_rows(self, field: str) -> dict[Device, slice]:
        return self._device_rows[_row_key(self.sharding(field, 1))]

    def device_rows(self, device: Device) -> np.ndarray:
        """Sorted rows one device holds, over all fields."""
        blocks = {
            (s.start, s.stop)
            for rows in self._device_rows.values()
            if (s := rows.get(device)) is not None
        }
        return np.concatenate([np.arange(a, z) for a, z in sorted(blocks)])


def _row_key(sharding: NamedSharding) -> tuple[Any, ...]:
    return (sharding.mesh, batch_axes(sharding))


def _global_shape(array: np.ndarray, global_batch_size: int) -> tuple[int, ...]:
    return (global_batch_size, *array.shape[1:])


class Builder(NamedTuple):
    """One strategy: the row sets a process reads for a step, and how it places them.

    Reading (host work: the source, record transforms, ``transform``) and placing (the
    global ``jax.Array``) are separate so the Loader can read ahead on a background
    thread while it places on the consuming one.
    """

    reads: Callable[[Layout], list[np.ndarray]]
    place: Callable[[list[dict[str, np.ndarray]], Layout], dict[str, jax.Array]]


def _reads_global(layout: Layout) -> list[np.ndarray]:
    return [np.arange(layout.global_batch_size)]


def _place_global(data: list[dict[str, np.ndarray]], layout: Layout) -> dict[str, jax.Array]:
    out = {}
    for name, array in data[0].items():
        sharding = layout.sharding(name, array.ndim)
        out[name] = jax.make_array_from_callback(
            array.shape, sharding, lambda index, a=array: a[index]
        )
    return out


def _reads_per_device(layout: Layout) -> list[np.ndarray]:
    return [layout.device_rows(device) for device in layout.devices]


def _place_per_device(data: list[dict[str, np.ndarray]], layout: Layout) -> dict[str, jax.Array]:
    b = layout.global_batch_size
    pieces: dict[str, list[jax.Array]] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for device, device_data in zip(layout.devices, data, strict=True):
        rows = layout.device_rows(device)
        for name, array in device_data.items():
            sharding = layout.sharding(name, array.ndim)
            block = layout.device_field_rows(name).get(device)
            if block is None:
                continue
            shape = shapes.setdefault(name, _global_shape(array, b))
            index = sharding.addressable_devices_indices_map(shape)[device]
            assert index is not None
            local = array[np.searchsorted(rows, np.arange(block.start, block.stop))]
            piece = local[(slice(None), *index[1:])]
            pieces.setdefault(name, []).append(jax.device_put(piece, device))
    return {
        name: jax.make_array_from_single_device_arrays(
            shapes[name], layout.sharding(name, len(shapes[name])), arrays
        )
        for name, arrays in pieces.items()
    }


def _reads_per_process(layout: Layout) -> list[np.ndarray]:
    return [layout.rows]


def _place_per_process(data: list[dict[str, np.ndarray]], layout: Layout) -> dict[str, jax.Array]:
    b = layout.global_batch_size
    offsets = layout.row_offsets
    out = {}
    for name, array in data[0].items():

        def local(index: Any, a: np.ndarray = array) -> np.ndarray:
            start, stop = index[0].indices(b)[:2]
            first = offsets[start]
            return a[(slice(first, first + stop - start), *index[1:])]

        out[name] = jax.make_array_from_callback(
            _global_shape(array, b), layout.sharding(name, array.ndim), local
        )
    return out


BUILDERS: dict[str, Builder] = {
    "global": Builder(_reads_global, _place_global),
    "per_device": Builder(_reads_per_device, _place_per_device),
    "per_process": Builder(_reads_per_process, _place_per_process),
    # On the load layout; the move happens in `reshard`.
    "reshard": Builder(_reads_per_process, _place_per_process),
}


def load_layout(sharding: ShardingArg, global_batch_size: int) -> ShardingArg:
    """The layout ``reshard`` loads in, per field (see ``_plan.load_sharding``)."""
    if isinstance(sharding, NamedSharding):
        return load_sharding(sharding, global_batch_size)
    return {name: load_sharding(s, global_batch_size) for name, s in sharding.items()}


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
