"""Where each field of a batch goes, and which rows of the batch that puts where.

A loader takes one ``NamedSharding`` for every field, or one per field. From the
sharding(s) and the global batch size follow the rows each device holds and the rows
this process must read (each once, replicas deduplicated); ``FieldShardings`` computes
them once, since they are the same at every step. The ``mask`` field (added with
``last_batch="pad"``) takes the batch dimension of the first sharding unless named.
``sequence_cut`` says, for a source of token rows, which slice of each row each device
holds where a context axis splits dimension 1, so ``per_device`` reads only that.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from meshfeed.core._mesh import Device, batch_axes, device_rows, process_rows
from meshfeed.data._sources import FieldSpec
from meshfeed.feed._plan import load_sharding
from meshfeed.feed._schedule import MASK

ShardingArg = NamedSharding | Mapping[str, NamedSharding]
"""A ``NamedSharding`` for every field, or a mapping field name -> ``NamedSharding``."""


def fit_to_rank(sharding: NamedSharding, ndim: int) -> NamedSharding:
    """Drops spec entries past ``ndim`` so one sharding can serve a lower-rank field."""
    if len(sharding.spec) <= ndim:
        return sharding
    return NamedSharding(sharding.mesh, P(*tuple(sharding.spec)[:ndim]))


def place_host(array: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """A host array that every process holds whole, placed by ``sharding``.

    Each addressable device gets its slice through ``jax.make_array_from_callback``,
    never a cross-process ``device_put``, which compares the data across processes.
    """
    return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])


def load_shardings(sharding: ShardingArg, global_batch_size: int) -> ShardingArg:
    """The shardings ``reshard`` loads in, per field (see ``_plan.load_sharding``)."""
    if isinstance(sharding, NamedSharding):
        return load_sharding(sharding, global_batch_size)
    return {name: load_sharding(s, global_batch_size) for name, s in sharding.items()}


def _row_key(sharding: NamedSharding) -> tuple[Any, ...]:
    return (sharding.mesh, batch_axes(sharding))


class FieldShardings:
    """The sharding of each field, and the batch rows each device and this process need."""

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
        process: dict[Any, np.ndarray] = {}
        for s in shardings:
            key = _row_key(s)
            if key not in process:
                self._device_rows[key] = device_rows(s, global_batch_size)
                process[key] = process_rows(s, global_batch_size)
        # The sorted batch rows this process reads (the union over fields), and where
        # each of them sits among those rows.
        self.process_rows = np.unique(np.concatenate(list(process.values())))
        self.row_offsets = {int(r): i for i, r in enumerate(self.process_rows)}
        self.devices = sorted(
            {d for rows in self._device_rows.values() for d in rows}, key=lambda d: d.id
        )

    def of(self, field: str, ndim: int) -> NamedSharding:
        """The sharding of ``field``, cut to its rank ``ndim``."""
        if field == MASK:
            return self._mask
        s = self._by_field.get(field, self._default)
        if s is None:
            raise ValueError(
                f"the batch has field {field!r} but the sharding mapping names only "
                f"{list(self._by_field)}; add {field!r} to it."
            )
        return fit_to_rank(s, ndim)

    def field_device_rows(self, field: str) -> dict[Device, slice]:
        """The rows of ``field`` each local device holds."""
        return self._device_rows[_row_key(self.of(field, 1))]

    def device_rows(self, device: Device) -> np.ndarray:
        """Sorted rows one device holds, over all fields."""
        blocks = {
            (s.start, s.stop)
            for rows in self._device_rows.values()
            if (s := rows.get(device)) is not None
        }
        return np.concatenate([np.arange(a, z) for a, z in sorted(blocks)])


class SequenceCut(NamedTuple):
    """Where ``per_device`` reads only a slice of each row: the sequence fields read cut,
    their whole per-example shapes, and the positions along ``T`` each device reads
    (devices not named read whole rows)."""

    shapes: dict[str, tuple[int, ...]]
    at: dict[Device, slice]


def sequence_cut(
    target: FieldShardings, fields: Mapping[str, FieldSpec], sequence_fields: Sequence[str]
) -> SequenceCut | None:
    """The slice of dimension 1 each local device holds of ``sequence_fields`` (shape
    ``[T, ...]``), where that is part of a row and the same for all of them on the device;
    ``None`` where no device holds part of a row."""
    shapes = {
        name: tuple(int(d) for d in fields[name].shape)
        for name in sequence_fields
        if name in fields and not fields[name].ragged and len(fields[name].shape) >= 1
    }
    b = target.global_batch_size
    held: dict[Device, set[tuple[int, int]]] = {}
    for name, shape in shapes.items():
        sharding = target.of(name, 1 + len(shape))
        for device, index in sharding.addressable_devices_indices_map((b, *shape)).items():
            assert index is not None
            start, stop = index[1].indices(shape[0])[:2]
            held.setdefault(device, set()).add((start, stop))
    lengths = {shape[0] for shape in shapes.values()}
    if len(lengths) != 1:
        return None
    at = {}
    for device, slices in held.items():
        if len(slices) != 1:
            continue  # the fields are split differently on this device: whole rows
        start, stop = next(iter(slices))
        if (start, stop) != (0, *lengths):
            at[device] = slice(start, stop)
    return SequenceCut(shapes, at) if at else None
