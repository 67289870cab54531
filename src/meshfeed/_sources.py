"""Sources: random access to examples by integer ids.

A source is anything with ``__len__``, ``__getitem__(ids) -> {field: array}`` and a
``fields`` mapping that tells each field's per-example shape and dtype without reading
data. The loader asks a source only for the ids its process needs, in one call per step,
so a source's job is a fast vectorised gather; everything about order, batching and
devices lives above it.
"""

from __future__ import annotations

import mmap
import os
import weakref
from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np


class FieldSpec(NamedTuple):
    """Per-example shape and dtype of one field."""

    shape: tuple[int, ...]
    dtype: np.dtype


def describe(fields: Mapping[str, FieldSpec]) -> str:
    """``{image: uint8[28, 28], label: int32[]}``, for messages."""
    parts = (f"{name}: {np.dtype(s.dtype)}{list(s.shape)}" for name, s in fields.items())
    return "{" + ", ".join(parts) + "}"


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


class _FileRows:
    """Rows of a read-only ``np.memmap`` read with ``pread``, not through the mapping.

    A gather through the mapping leaves every page it touched mapped into the process:
    its resident size grows towards the file's size over an epoch. ``pread`` copies the
    same bytes from the page cache into a fresh buffer and maps nothing.
    """

    def __init__(self, array: Any) -> None:
        self.path = str(array.filename)
        self.offset = int(array.offset)
        self.shape = tuple(array.shape[1:])
        self.dtype = array.dtype
        self.row_bytes = int(np.prod(self.shape, dtype=np.int64)) * array.dtype.itemsize
        self._fd: int | None = None

    @staticmethod
    def usable(array: np.ndarray) -> bool:
        return (
            isinstance(array, np.memmap)
            and isinstance(array.base, mmap.mmap)  # the whole mapping, not a view of it
            and array.mode in ("r", "r+")  # "c" keeps private changes pread cannot see
            and array.flags.c_contiguous
            and bool(array.filename)
        )

    def _open(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
            weakref.finalize(self, os.close, self._fd)
        return self._fd

    def __getitem__(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        out = np.empty((len(ids), *self.shape), self.dtype)
        if not len(ids) or not self.row_bytes:
            return out
        fd = self._open()
        order = np.argsort(ids, kind="stable")
        ordered = ids[order]
        rows = np.empty((len(ids), self.row_bytes), np.uint8)
        # Consecutive ids are one read.
        starts = np.flatnonzero(np.diff(ordered, prepend=ordered[0] - 2) != 1)
        ends = np.append(starts[1:], len(ids))
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
            view = memoryview(rows[a:b]).cast("B")  # type: ignore[arg-type]
            at, done = self.offset + int(ordered[a]) * self.row_bytes, 0
            while done < len(view):
                got = os.preadv(fd, [view[done:]], at + done)
                if got == 0:
                    raise IndexError(f"ids {ordered[a]}..{ordered[b - 1]} are past the file's end.")
                done += got
        out.reshape(len(ids), -1).view(np.uint8)[order] = rows
        return out


class ArraySource:
    """A source over equal-length arrays (numpy arrays or ``np.memmap``).

    Each step is one vectorised gather per field. A whole read-only memmap (as
    ``np.load(path, mmap_mode="r")`` returns) is read with ``pread`` instead, so only
    the rows asked for are copied and the process's resident memory stays at the size of
    the batches, however large the file. ``pread=False`` gathers through the mapping
    instead: faster while the file sits in the page cache (about 4x here), but every page
    touched stays resident in the process.

    Example:
      >>> src = ArraySource({"image": np.zeros((10, 28, 28), np.uint8),
      ...                    "label": np.arange(10)})
      >>> src[np.array([3, 1])]["label"]
      array([3, 1])
    """

    def __init__(self, arrays: Mapping[str, np.ndarray], *, pread: bool = True) -> None:
        if not isinstance(arrays, Mapping) or not arrays:
            raise TypeError(
                "ArraySource takes a non-empty mapping of field name to array, e.g. "
                "ArraySource({'image': x, 'label': y})."
            )
        data: dict[str, np.ndarray] = {}
        for name, array in arrays.items():
            if not isinstance(name, str):
                raise TypeError(f"field names must be str, got {name!r}.")
            if not isinstance(array, np.ndarray):
                raise TypeError(
                    f"field {name!r} is a {type(array).__name__}; pass a numpy array or "
                    "np.memmap (np.asarray(x) for lists)."
                )
            if array.ndim == 0:
                raise ValueError(
                    f"field {name!r} is a 0-d array; give it a leading example dimension."
                )
            data[name] = array
        lengths = {name: len(a) for name, a in data.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(
                f"fields have different lengths {lengths}; every field needs one row per example."
            )
        self._arrays = data
        self._readers: dict[str, Any] = {
            name: _FileRows(a) if pread and _FileRows.usable(a) else a for name, a in data.items()
        }
        self._len = next(iter(lengths.values()))
        self._fields = {
            name: FieldSpec(tuple(a.shape[1:]), np.dtype(a.dtype)) for name, a in data.items()
        }

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        return self._fields

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        return {name: a[ids] for name, a in self._readers.items()}

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}: {v.dtype}{list(v.shape)}" for k, v in self._fields.items())
        return f"ArraySource({self._len} examples; {fields})"
