"""Sources: random access to examples by integer ids.

A source is anything with ``__len__``, ``__getitem__(ids) -> {field: array}`` and a
``fields`` mapping that tells each field's per-example shape and dtype without reading
data. The loader asks a source only for the ids its process needs, in one call per step,
so a source's job is a fast vectorised gather; everything about order, batching and
devices lives above it.

The helpers below are what every source built from parts (shards, row groups, the
sources of a mixture) needs: the ids' range check, and a gather that reads each part
once per call and puts its rows where they belong.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np


class FieldSpec(NamedTuple):
    """Per-example shape and dtype of one field."""

    shape: tuple[int, ...]
    dtype: np.dtype


def field_text(spec: FieldSpec) -> str:
    """``uint8[28, 28]``: one field's dtype and per-example shape, for messages."""
    return f"{np.dtype(spec.dtype)}{list(spec.shape)}"


def fields_text(fields: Mapping[str, FieldSpec]) -> str:
    """``image: uint8[28, 28], label: int32[]``, for reprs and messages."""
    return ", ".join(f"{name}: {field_text(spec)}" for name, spec in fields.items())


def describe(fields: Mapping[str, FieldSpec]) -> str:
    """``{image: uint8[28, 28], label: int32[]}``, for messages."""
    return "{" + fields_text(fields) + "}"


@runtime_checkable
class Source(Protocol):
    """Random access to examples by integer ids.

    ``source[ids]`` takes a 1-D ``int64`` array of ids in ``[0, len(source))`` (in any
    order, possibly repeated) and returns one array per field whose first dimension
    follows ``ids``.
    """

    @property
    def fields(self) -> Mapping[str, FieldSpec]: ...

    def __len__(self) -> int: ...

    def __getitem__(self, ids: np.ndarray) -> dict[str, np.ndarray]: ...


def check_ids(ids: object, n: int, name: str) -> np.ndarray:
    """``ids`` as ``int64``; raises ``IndexError`` unless every id is in ``[0, n)``."""
    out = np.asarray(ids, dtype=np.int64)
    if len(out) and (out.min() < 0 or out.max() >= n):
        raise IndexError(f"ids must be in [0, {n}) for {name}.")
    return out


def locate(starts: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(part, id within the part) of each id, for parts starting at ``starts``.

    ``starts`` is ascending and begins with 0 (a cumulative sum of part lengths).
    """
    part = np.searchsorted(starts, ids, side="right") - 1
    return part, ids - starts[part]


def gather_by_part(
    part: np.ndarray,
    local: np.ndarray,
    fields: Mapping[str, FieldSpec],
    read: Callable[[int, np.ndarray], Mapping[str, np.ndarray]],
) -> dict[str, np.ndarray]:
    """Rows from several parts, in the order asked for.

    Row ``i`` is row ``local[i]`` of part ``part[i]``; ``read(p, local_ids)`` reads the
    rows of part ``p``, called once per part that holds any.
    """
    out = {k: np.empty((len(part), *s.shape), s.dtype) for k, s in fields.items()}
    for p in np.unique(part).tolist():
        where = np.flatnonzero(part == p)
        for name, values in read(p, local[where]).items():
            out[name][where] = values
    return out
