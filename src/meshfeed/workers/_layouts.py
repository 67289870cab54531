"""How a chunk's rows are laid out in a shared block, for a worker to read.

``put_rows`` writes a chunk's fields into an input block without pickle where it can
be helped -- numeric fields as their bytes, fields of ``bytes`` (encoded images,
records) as one run of bytes plus their lengths, anything else pickled -- and returns
its *layout*, which the task names; ``get_rows`` reads it back in the worker (numeric
fields as views, no copy). ``stage`` gives arrays over an input block for a source to
read a step's rows straight into (``Staged.chunk``: each chunk's layout). A layout may
also name rows of the source's copy in shared memory (``_shared_rows``) by their ids;
``get_rows`` gathers those.
"""

from __future__ import annotations

import dataclasses
import math
import pickle
from collections.abc import Mapping
from typing import Any

import numpy as np

from meshfeed.core._held import layout, lend
from meshfeed.data._sources import FieldSpec
from meshfeed.workers._shared_rows import gather

Spec = Mapping[str, FieldSpec]
IDS = "__meshfeed_ids__"  # a chunk's example ids, beside its fields in the input block

Layout = list[tuple[Any, ...]]  # how put_rows laid out a chunk's fields in a block
Prepared = list[tuple[str, str, Any]]  # (field, kind, what to write)


def prepare_rows(part: Mapping[str, Any]) -> tuple[Prepared, int]:
    """What ``put_rows`` writes for ``part``, and the bytes it takes (alignment included)."""
    prepared: Prepared = []
    size = 0
    for name, column in part.items():
        if isinstance(column, np.ndarray) and column.dtype != object:
            column = np.ascontiguousarray(column)
            prepared.append((name, "array", column))
            size += column.nbytes
        elif isinstance(column, np.ndarray) and set(map(type, column)) <= {bytes}:
            lengths = np.fromiter(map(len, column), np.int64, len(column))
            data = b"".join(column)
            prepared.append((name, "bytes", (lengths, data)))
            size += lengths.nbytes + len(data)
        else:  # a Ragged, objects of other kinds
            blob = pickle.dumps(column, protocol=5)
            prepared.append((name, "pickle", blob))
            size += len(blob)
        size += 64
    return prepared, size


def _aligned(at: int) -> int:
    return -(-at // 64) * 64


def put_rows(buffer: Any, at: int, prepared: Prepared) -> tuple[Layout, int]:
    """Writes prepared fields into ``buffer`` from ``at``; returns the layout and the end."""
    layout: Layout = []
    for name, kind, value in prepared:
        at = _aligned(at)
        if kind == "array":
            np.ndarray(value.shape, value.dtype, buffer=buffer, offset=at)[...] = value
            layout.append((kind, name, value.dtype.str, value.shape, at))
            at += value.nbytes
        elif kind == "bytes":
            lengths, data = value
            np.ndarray(lengths.shape, np.int64, buffer=buffer, offset=at)[...] = lengths
            start = at + lengths.nbytes
            buffer[start : start + len(data)] = data
            layout.append((kind, name, len(lengths), at))
            at = start + len(data)
        else:
            buffer[at : at + len(value)] = value
            layout.append((kind, name, len(value), at))
            at += len(value)
    return layout, at


def get_rows(buffer: Any, layout: Layout) -> dict[str, np.ndarray]:
    """The fields ``put_rows`` wrote (numeric ones as views of ``buffer``), or those a
    ``SharedRows.chunk`` names (rows gathered out of ``buffer``, the source's copy)."""
    out: dict[str, np.ndarray] = {}
    ids = next((rest[0] for kind, _, *rest in layout if kind == "ids"), None)
    for kind, name, *rest in layout:
        if kind == "ids":
            out[name] = rest[0]
        elif kind == "gather":
            assert ids is not None, "a chunk of shared rows names its ids"
            out[name] = gather(buffer, (kind, name, *rest), ids)
        elif kind == "array":
            dtype, shape, at = rest
            out[name] = np.ndarray(shape, np.dtype(dtype), buffer=buffer, offset=at)
        elif kind == "bytes":
            count, at = rest
            ends = np.ndarray((count,), np.int64, buffer=buffer, offset=at).cumsum().tolist()
            start = at + 8 * count
            data = bytes(buffer[start : start + (ends[-1] if count else 0)])
            column = np.empty(count, object)
            column[:] = [data[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]
            out[name] = column
        else:
            size, at = rest
            out[name] = pickle.loads(buffer[at : at + size])
    return out


@dataclasses.dataclass
class Staged:
    """An input block a step's rows are read straight into (``stage``): each field's
    rows as arrays over it, the ids' place, and where each field starts."""

    block: int
    rows: dict[str, np.ndarray]
    ids: np.ndarray
    starts: list[tuple[str, np.dtype, tuple[int, ...], int]]  # name, dtype, row shape, at

    def hand_over(self, ids: np.ndarray) -> None:
        """Writes the rows' ids beside them and drops the arrays: the block is the
        workers' now."""
        self.ids[...] = ids
        self.rows.clear()

    def chunk(self, lo: int, hi: int) -> Layout:
        """The layout of rows ``[lo, hi)`` in the block (``get_rows`` reads it)."""
        rows = hi - lo
        return [
            ("array", name, dtype.str, (rows, *shape), at + lo * math.prod(shape) * dtype.itemsize)
            for name, dtype, shape, at in self.starts
        ]


def staged_spec(fields: Spec) -> dict[str, FieldSpec]:
    """The fields of a staged block: the source's, and the ids."""
    return {**fields, IDS: FieldSpec((), np.dtype(np.int64))}


def stage(buffer: Any, block: int, fields: Spec, rows: int) -> Staged:
    """Arrays over ``buffer`` (input block ``block``) for ``rows`` rows of ``fields`` and
    their ids. They hold the block's mapping (``core._held.lend``): a pool closed while
    a read into them is under way leaves the memory to them instead of unmapping it."""
    at, _ = layout(staged_spec(fields), rows)
    arrays = lend(buffer, at, lambda: None)
    ids = arrays.pop(IDS)
    return Staged(block, arrays, ids, [(name, dtype, shape[1:], o) for name, shape, dtype, o in at])
