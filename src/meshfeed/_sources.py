"""Sources: random access to examples by integer ids.

A source is anything with ``__len__``, ``__getitem__(ids) -> {field: array}`` and a
``fields`` mapping that tells each field's per-example shape and dtype without reading
data. The loader asks a source only for the ids its process needs, in one call per step,
so a source's job is a fast vectorised gather; everything about order, batching and
devices lives above it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np


class FieldSpec(NamedTuple):
    """Per-example shape and dtype of one field."""

    shape: tuple[int, ...]
    dtype: np.dtype


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


class ArraySource:
    """A source over equal-length arrays (numpy arrays or ``np.memmap``).

    Each step is one vectorised gather per field; a memmap reads only the rows asked
    for.

    Example:
      >>> src = ArraySource({"image": np.zeros((10, 28, 28), np.uint8),
      ...                    "label": np.arange(10)})
      >>> src[np.array([3, 1])]["label"]
      array([3, 1])
    """

    def __init__(self, arrays: Mapping[str, np.ndarray]) -> None:
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
        return {name: a[ids] for name, a in self._arrays.items()}

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}: {v.dtype}{list(v.shape)}" for k, v in self._fields.items())
        return f"ArraySource({self._len} examples; {fields})"
