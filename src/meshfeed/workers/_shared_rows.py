"""A source's rows in shared memory, read by the record workers themselves.

Worker processes start bare (no fork of a process running JAX), so they cannot see the
loading process's memory: each step's rows are copied into a shared input block for
them -- a memcpy of the batch a step, on the one process that feeds every device. A
forked PyTorch ``DataLoader`` worker reads an in-memory dataset where it lies instead.
``SharedRows`` is that for an ``ArraySource`` held in memory: its rows are copied once,
when the workers start, into one shared block (each field 64-byte aligned), and a task
then names its chunk's example ids, not its rows: the worker gathers them itself
(``gather``), into memory of its own, so a record transform may write to its record as
before. The copy is the source's size, so it is made only where it is small beside
/dev/shm (``fits``); elsewhere the rows go through input blocks as before. The workers
see the arrays as they were when they started.

This module imports no JAX: worker processes use it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from meshfeed.core._held import layout
from meshfeed.data._sources import FieldSpec

MOST_BYTES = 1 << 30
"""The largest source copied into shared memory (1 GiB): beyond it, a step's copy costs
little beside the memory a second copy of the source would take."""
SHM_PART = 0.25
"""Of /dev/shm's free space, the most the copy may take (the read-ahead's blocks and
the machine's other processes need the rest)."""
ROW_BY_ROW = 16 << 10  # rows this large are gathered one by one (ArraySource.read_into's rule)


def fits(nbytes: int, shm_free: int | None) -> bool:
    """Whether a source of ``nbytes`` is copied into shared memory with ``shm_free`` bytes
    free there (``None``: no /dev/shm)."""
    return shm_free is not None and 0 < nbytes <= min(MOST_BYTES, int(shm_free * SHM_PART))


class SharedRows:
    """The fields of an in-memory source copied into ``block`` (a shared block of at least
    ``size(arrays)`` bytes); ``chunk(ids)`` is what a task names."""

    def __init__(self, block: Any, arrays: Mapping[str, np.ndarray]) -> None:
        n = len(next(iter(arrays.values())))
        spec = {name: FieldSpec(a.shape[1:], a.dtype) for name, a in arrays.items()}
        fields, _ = layout(spec, n)
        for (_, shape, dtype, at), array in zip(fields, arrays.values(), strict=True):
            np.ndarray(shape, dtype, buffer=block.buf, offset=at)[...] = array
        self.block = block
        self.name = block.name
        self.rows = n
        self._fields = [(name, dtype.str, shape[1:], at) for name, shape, dtype, at in fields]

    def chunk(self, ids: np.ndarray, ids_field: str) -> list[tuple[Any, ...]]:
        """A task's layout of the rows ``ids`` (``_layouts.get_rows`` reads it, ``gather``
        for each field), with the ids themselves as field ``ids_field``."""
        rows = [
            ("gather", name, dtype, shape, at, self.rows) for name, dtype, shape, at in self._fields
        ]
        return [*rows, ("ids", ids_field, np.ascontiguousarray(ids, np.int64))]


def size(arrays: Mapping[str, np.ndarray]) -> int:
    """The bytes ``SharedRows`` takes for ``arrays``."""
    n = len(next(iter(arrays.values())))
    return layout({k: FieldSpec(a.shape[1:], a.dtype) for k, a in arrays.items()}, n)[1]


def gather(buffer: Any, entry: tuple[Any, ...], ids: np.ndarray) -> np.ndarray:
    """Rows ``ids`` of the field ``entry`` (a ``chunk`` entry) names in ``buffer``, copied
    out into a new array."""
    _, _, dtype, shape, at, rows = entry
    array = np.ndarray((rows, *shape), np.dtype(dtype), buffer=buffer, offset=at)
    if array.itemsize * math.prod(shape) < ROW_BY_ROW:
        return array[ids]
    out = np.empty((len(ids), *shape), array.dtype)
    for i, example in enumerate(ids.tolist()):  # a memcpy a row, no index arrays
        out[i] = array[example]
    return out
