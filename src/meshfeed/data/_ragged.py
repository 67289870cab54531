"""Variable-length values: one field's documents stored flat, with offsets.

A token field holds documents of every length. ``Ragged(values, offsets)`` keeps them
the way Arrow and Parquet do: all values one after another (``values``, 1-D, or with
trailing fixed dimensions such as ``[total, 3]``) and ``N + 1`` non-decreasing
``offsets``, so document ``i`` is ``values[offsets[i]:offsets[i + 1]]``. Gathering
documents by id is one fancy index on ``values``; a document's length is a difference
of offsets, so a source can tell every length without reading a value. A ragged
field's ``FieldSpec.shape`` is ``(None, *trailing)``.

Ragged values cannot go to devices as they are: ``meshfeed.pack`` packs them into
fixed rows, or a ``record_transform`` pads or crops them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np


class Ragged:
    """``N`` variable-length documents of one field: flat ``values`` and ``N + 1`` offsets.

    Args:
      values: every document's values, one after another; 1-D, or with trailing fixed
        dimensions (``[total, 3]``).
      offsets: ``N + 1`` non-decreasing integers from 0 to ``len(values)``.

    Example:
      >>> r = Ragged.from_list([np.array([5, 6, 7]), np.array([8])])
      >>> r.lengths, r[0], len(r[np.array([1, 1])])
      (array([3, 1]), array([5, 6, 7]), 2)
    """

    def __init__(self, values: Any, offsets: Any) -> None:
        values = np.asarray(values)
        offsets = np.asarray(offsets)
        if values.ndim == 0:
            raise ValueError(
                "Ragged values must be an array of at least 1 dimension, got a scalar."
            )
        if values.dtype.hasobject:
            raise TypeError(
                "Ragged values must be numbers, not Python objects; pass each document as a "
                "numeric array (Ragged.from_list([np.array([...]), ...]))."
            )
        if offsets.ndim != 1 or not len(offsets) or offsets.dtype.kind not in "iu":
            raise ValueError(
                f"Ragged offsets must be a 1-D integer array of N + 1 entries, got "
                f"{offsets.dtype}{list(offsets.shape)}."
            )
        offsets = offsets.astype(np.int64, copy=False)
        if offsets[0] != 0 or offsets[-1] != len(values):
            raise ValueError(
                f"Ragged offsets must run from 0 to len(values)={len(values)}, got "
                f"{int(offsets[0])} to {int(offsets[-1])}."
            )
        steps = np.diff(offsets)
        if len(steps) and steps.min() < 0:
            at = int(np.argmax(steps < 0))
            raise ValueError(
                f"Ragged offsets must not decrease, but offsets[{at + 1}]={int(offsets[at + 1])} "
                f"< offsets[{at}]={int(offsets[at])}."
            )
        self.values = values
        self.offsets = offsets

    @classmethod
    def from_list(cls, arrays: Iterable[Any], *, dtype: Any = None) -> Ragged:
        """Documents given one array each (all with the same trailing dimensions)."""
        parts = [np.asarray(a, dtype=dtype) for a in arrays]
        for i, a in enumerate(parts):
            if a.ndim == 0:
                raise ValueError(f"document {i} is a scalar; give each document a length.")
            if a.shape[1:] != parts[0].shape[1:]:
                raise ValueError(
                    f"document {i} has trailing shape {a.shape[1:]}, document 0 has "
                    f"{parts[0].shape[1:]}; only the first dimension may vary."
                )
        offsets = np.zeros(len(parts) + 1, np.int64)
        np.cumsum([len(a) for a in parts], out=offsets[1:])
        if not parts:
            return cls(np.zeros(0, dtype or np.int64), offsets)
        return cls(np.concatenate(parts), offsets)

    @classmethod
    def concat(cls, pieces: Sequence[Ragged]) -> Ragged:
        """The documents of ``pieces``, one piece after another."""
        if not pieces:
            raise ValueError("Ragged.concat needs at least one piece.")
        values = np.concatenate([p.values for p in pieces])
        lengths = np.concatenate([p.lengths for p in pieces])
        return cls(values, _offsets(lengths))

    @classmethod
    def expand(cls, valid: np.ndarray, documents: Ragged) -> Ragged:
        """``len(valid)`` documents: ``documents`` where ``valid``, empty ones elsewhere."""
        lengths = np.zeros(len(valid), np.int64)
        lengths[valid] = documents.lengths
        return cls(documents.values, _offsets(lengths))

    def __len__(self) -> int:
        """The number of documents."""
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        """Each document's length (``int64``), from the offsets."""
        return np.diff(self.offsets)

    @property
    def dtype(self) -> np.dtype:
        """The values' dtype."""
        return self.values.dtype

    @property
    def shape(self) -> tuple[int | None, ...]:
        """``(N, None, *trailing)``: as a batch of documents of unknown length."""
        return (len(self), None, *self.values.shape[1:])

    @property
    def nbytes(self) -> int:
        """Bytes of the values and the offsets."""
        return self.values.nbytes + self.offsets.nbytes

    def __getitem__(self, key: Any) -> Any:
        """``r[i]``: document ``i`` (an array); ``r[a:b]`` or ``r[ids]``: a ``Ragged``."""
        if isinstance(key, int | np.integer):
            i = int(key)
            if not -len(self) <= i < len(self):
                raise IndexError(f"document {i} is out of range for {len(self)} documents.")
            i %= len(self)
            return self.values[self.offsets[i] : self.offsets[i + 1]]
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step == 1:
                lo, hi = self.offsets[start], self.offsets[max(start, stop)]
                return Ragged(self.values[lo:hi], self.offsets[start : max(start, stop) + 1] - lo)
            key = np.arange(start, stop, step)
        return self.take(np.asarray(key))

    def take(self, ids: np.ndarray) -> Ragged:
        """The documents ``ids`` (any order, repeats allowed), as a new ``Ragged``."""
        ids = np.asarray(ids)
        if ids.dtype == bool:
            ids = np.flatnonzero(ids)
        ids = ids.astype(np.int64, copy=False)
        if len(ids) and (ids.min() < -len(self) or ids.max() >= len(self)):
            raise IndexError(f"document ids must be in [0, {len(self)}).")
        ids = ids % max(len(self), 1)
        starts = self.offsets[ids]
        lengths = self.offsets[ids + 1] - starts
        offsets = _offsets(lengths)
        index = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
        return Ragged(self.values[index], offsets)

    def to_list(self) -> list[np.ndarray]:
        """The documents as a list of 1-D arrays (views of the values)."""
        return [self[i] for i in range(len(self))]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Ragged):
            return NotImplemented
        return (
            np.array_equal(self.offsets, other.offsets)
            and self.values.dtype == other.values.dtype
            and np.array_equal(self.values, other.values)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable arrays inside

    def __repr__(self) -> str:
        trailing = "".join(f", {d}" for d in self.values.shape[1:])
        return (
            f"Ragged({len(self)} documents of {self.dtype}[*{trailing}], {len(self.values)} values)"
        )


def _offsets(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def is_ragged_shape(shape: Sequence[int | None]) -> bool:
    """Whether a ``FieldSpec.shape`` is a ragged field's (``(None, ...)``)."""
    return bool(len(shape)) and shape[0] is None


def empty(n: int, dtype: Any, trailing: Sequence[int] = ()) -> Ragged:
    """``n`` empty documents."""
    return Ragged(np.zeros((0, *trailing), dtype), np.zeros(n + 1, np.int64))


def assemble(n: int, parts: Sequence[tuple[np.ndarray, Ragged]], dtype: Any) -> Ragged:
    """``n`` documents put together from parts: each ``(where, documents)`` gives the
    positions its documents take (every position once)."""
    if not parts:
        return empty(n, dtype)
    joined = Ragged.concat([r for _, r in parts])
    where = np.concatenate([w for w, _ in parts])
    order = np.empty(n, np.int64)
    order[where] = np.arange(len(where))
    return joined.take(order)
