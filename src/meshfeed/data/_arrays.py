"""``ArraySource``: a source over numpy arrays, ``np.memmap`` files and ``Ragged`` fields."""

from __future__ import annotations

import math
import mmap
from collections.abc import Mapping
from typing import Any, TypeGuard

import numpy as np

from meshfeed.data._files import RowFile
from meshfeed.data._ragged import Ragged
from meshfeed.data._sources import FieldSpec, example_at, fields_text
from meshfeed.storage._blob import Blob

_ROW_BY_ROW = 16 << 10  # rows this large are copied one by one (a call a row is then cheap)


def _whole_file_memmap(array: object) -> TypeGuard[np.memmap]:
    """A read-only memmap of a whole file's rows, which ``pread`` can read instead."""
    return (
        isinstance(array, np.memmap)
        and isinstance(array.base, mmap.mmap)  # the whole mapping, not a view of it
        and array.mode in ("r", "r+")  # "c" keeps private changes pread cannot see
        and array.flags.c_contiguous
        and bool(array.filename)
    )


def _pread_rows(array: np.memmap) -> RowFile:
    path = str(array.filename)
    return RowFile(
        Blob(path),
        offset=int(array.offset),
        rows=len(array),
        shape=tuple(array.shape[1:]),
        dtype=array.dtype,
        name=path,
    )


class ArraySource:
    """A source over equal-length arrays (numpy arrays, ``np.memmap`` or ``Ragged``).

    Each step is one vectorised gather per field. A whole read-only memmap (as
    ``np.load(path, mmap_mode="r")`` returns) is read with ``pread`` instead, so only
    the rows asked for are copied and the process's resident memory stays at the size of
    the batches, however large the file: a gather through the mapping leaves every page
    it touched mapped into the process, so its resident size grows towards the file's
    over an epoch. ``pread=False`` gathers through the mapping all the same: faster
    while the file sits in the page cache (about 4x here), but every page touched stays
    resident in the process. A ``Ragged`` field gives a ``Ragged`` of the documents
    asked for, and ``lengths(field)`` gives every document's length.

    Example:
      >>> src = ArraySource({"image": np.zeros((10, 28, 28), np.uint8),
      ...                    "label": np.arange(10)})
      >>> src[np.array([3, 1])]["label"]
      array([3, 1])
    """

    def __init__(self, arrays: Mapping[str, np.ndarray | Ragged], *, pread: bool = True) -> None:
        if not isinstance(arrays, Mapping) or not arrays:
            raise TypeError(
                "ArraySource takes a non-empty mapping of field name to array, e.g. "
                "ArraySource({'image': x, 'label': y})."
            )
        data: dict[str, np.ndarray | Ragged] = {}
        for name, array in arrays.items():
            if not isinstance(name, str):
                raise TypeError(f"field names must be str, got {name!r}.")
            if isinstance(array, Ragged):
                data[name] = array
                continue
            if not isinstance(array, np.ndarray):
                raise TypeError(
                    f"field {name!r} is a {type(array).__name__}; pass a numpy array, "
                    "np.memmap or meshfeed.Ragged (np.asarray(x) for lists of numbers, "
                    "Ragged.from_list(x) for lists of documents)."
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
        self._ragged = {name: a for name, a in data.items() if isinstance(a, Ragged)}
        self._files = {
            name: _pread_rows(a) for name, a in data.items() if pread and _whole_file_memmap(a)
        }
        self._gathers: dict[str, Any] = {
            name: self._files[name].read if name in self._files else a.__getitem__
            for name, a in data.items()
        }
        # The arrays read_into gathers from (a memmap read with pread is its file's: it
        # pickles as its path, for the workers that open the source themselves).
        self._arrays = {name: a for name, a in data.items() if name not in self._files}
        self._len = next(iter(lengths.values()))
        self._fields = {
            name: FieldSpec(tuple(a.shape[1:]), np.dtype(a.dtype)) for name, a in data.items()
        }

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        """Each field's shape and dtype (per example), by name."""
        return self._fields

    def __len__(self) -> int:
        """The number of examples."""
        return self._len

    def __getitem__(self, ids: np.ndarray | int) -> dict[str, Any]:
        """The examples ``ids`` (a 1-D int array): one array per field, a row per id."""
        if isinstance(ids, int | np.integer):  # source[i]: one example
            return example_at(self, ids)
        return {name: gather(ids) for name, gather in self._gathers.items()}

    def read_into(self, ids: np.ndarray, out: Mapping[str, np.ndarray]) -> None:
        """The examples ``ids`` of every field straight into ``out`` (an array of
        ``len(ids)`` rows per field, C-contiguous; no ragged fields), with no array in
        between where a row is large: what the record workers' shared memory is filled
        with, one copy instead of two."""
        for name, rows in out.items():
            if name in self._files:
                self._files[name].read_into(ids, rows)
                continue
            array = self._arrays[name]
            assert not isinstance(array, Ragged), "read_into takes fixed-size fields only"
            if array.itemsize * math.prod(array.shape[1:]) < _ROW_BY_ROW:
                rows[...] = array[ids]
                continue
            for at, example in enumerate(ids.tolist()):  # a memcpy a row, no gather buffer
                rows[at] = array[example]

    def memory_arrays(self) -> dict[str, np.ndarray] | None:
        """Every field's array, where each is a numeric array in this process's memory
        (no memmap, no ``Ragged``): what record worker processes may read from a copy in
        shared memory, made once when they start (they then see the arrays as they
        were). ``None`` otherwise."""
        arrays = {}
        for name in self._fields:
            array = self._arrays.get(name)
            if (
                type(array) is not np.ndarray
                or array.dtype.hasobject
                or isinstance(array.base, mmap.mmap)
            ):
                return None
            arrays[name] = array
        return arrays

    def lengths(self, field: str) -> np.ndarray:
        """Every document's length in the ragged ``field``."""
        if field not in self._ragged:
            raise ValueError(
                f"lengths({field!r}): that is not a ragged field of this source; its ragged "
                f"fields are {sorted(self._ragged)}."
            )
        return self._ragged[field].lengths

    def __repr__(self) -> str:
        return f"ArraySource({self._len} examples; {fields_text(self._fields)})"
