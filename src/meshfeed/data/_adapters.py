"""Sources over libraries that hand out one record at a time: Grain, PyTorch, ArrayRecord.

Each adapter is a ``Source``: it reads only the ids the loader asks for, and imports its
library only when built (the error names the extra to install). Fixed-size values come
back as numpy arrays with a leading example dimension. **Variable-length values** (token
lists of different lengths, encoded images, strings) come back as object arrays, one
Python value per example (``bytes``, ``str`` or a 1-D numpy array), so nothing is cut
or padded behind the user's back; a ``record_transform`` (decode, crop, pad) or a
``transform`` turns them into fixed-size arrays before they reach devices, and the
loader says so if one reaches it untransformed. (Arrow-backed sources, ``_arrow``, give
variable-length lists of numbers as ``Ragged`` instead.)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from meshfeed.data._sources import FieldSpec, check_ids, example_at

OBJECT = np.dtype(object)


def require(module: str, extra: str) -> Any:
    """Imports ``module``, or raises an ``ImportError`` naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(
            f"this source needs {module.split('.')[0]}: pip install 'meshfeed[{extra}]'"
            f" (from a clone: pip install -e '.[{extra}]')."
        ) from None


class _Records:
    """A source built from per-example records (dicts of values)."""

    def __init__(
        self, get: Callable[[int], Any], n: int, *, name: str, variable: Sequence[str]
    ) -> None:
        if n == 0:
            raise ValueError(f"{name} has no examples.")
        self._get = get
        self._n = n
        self.name = name
        self._variable = set(variable)
        first = self._record(0)
        unknown = self._variable - set(first)
        if unknown:
            raise ValueError(f"variable={sorted(unknown)} names no field of {name}: {list(first)}.")
        self._fields: dict[str, FieldSpec] = {}
        for key, value in first.items():
            if key in self._variable or isinstance(value, bytes | str):
                self._fields[key] = FieldSpec((), OBJECT)
            else:
                array = np.asarray(value)
                if array.dtype == OBJECT:
                    self._fields[key] = FieldSpec((), OBJECT)
                else:
                    self._fields[key] = FieldSpec(tuple(array.shape), array.dtype)

    def _record(self, i: int) -> dict[str, Any]:
        record = self._get(i)
        if isinstance(record, Mapping):
            return {str(k): _numpy(v) for k, v in record.items()}
        if isinstance(record, tuple | list):
            return {str(k): _numpy(v) for k, v in enumerate(record)}
        return {"x": _numpy(record)}

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        """Each field's shape and dtype (per example), by name."""
        return self._fields

    def __len__(self) -> int:
        """The number of examples."""
        return self._n

    def __getitem__(self, ids: np.ndarray | int) -> dict[str, Any]:
        """The examples ``ids`` (a 1-D int array): one array per field, a row per id."""
        if isinstance(ids, int | np.integer):  # source[i]: one example
            return example_at(self, ids)
        ids = check_ids(ids, self._n, self.name)
        return _stack([self._record(i) for i in ids.tolist()], self._fields, self.name, ids)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name}, {self._n} examples)"


def _numpy(value: Any) -> Any:
    if hasattr(value, "numpy") and callable(value.numpy):  # a torch tensor
        return value.detach().cpu().numpy() if hasattr(value, "detach") else value.numpy()
    return value


class GrainSource(_Records):
    """A Grain ``MapDataset`` or random-access data source (``len``, ``[i]``).

    Args:
      dataset: the Grain dataset; each element a dict of values (or a tuple, fields
        ``"0"``, ``"1"``, ..., or one value, field ``"x"``).
      variable: fields to return as object arrays (values that change shape).
    """

    def __init__(self, dataset: Any, *, variable: Sequence[str] = ()) -> None:
        require("grain", "grain")
        super().__init__(
            dataset.__getitem__, len(dataset), name=type(dataset).__name__, variable=variable
        )


class TorchSource(_Records):
    """A map-style PyTorch ``Dataset`` (``len``, ``[i]``); tensors become numpy arrays.

    Args:
      dataset: each element a dict, a tuple (fields ``"0"``, ``"1"``, ...) or one value
        (field ``"x"``).
      variable: fields to return as object arrays (values that change shape).

    A ``Dataset`` is written for worker processes, not threads, so the loader reads it
    one call at a time (``thread_safe = False``).
    """

    thread_safe = False

    def __init__(self, dataset: Any, *, variable: Sequence[str] = ()) -> None:
        require("torch", "torch")
        super().__init__(
            dataset.__getitem__, len(dataset), name=type(dataset).__name__, variable=variable
        )


class ArrayRecordSource:
    """ArrayRecord files: each record is bytes, turned into a dict of values by ``decode``.

    Args:
      paths: one file or a list of files (read as one sequence of records).
      decode: ``fn(bytes) -> dict`` of values; ``None`` returns the bytes themselves as
        the object field ``"record"``.
      variable: decoded fields to return as object arrays.
    """

    def __init__(
        self,
        paths: str | Sequence[str],
        decode: Callable[[bytes], Mapping[str, Any]] | None = None,
        *,
        variable: Sequence[str] = (),
    ) -> None:
        module = require("array_record.python.array_record_data_source", "arrayrecord")
        files = [paths] if isinstance(paths, str) else list(paths)
        self._reader = module.ArrayRecordDataSource(files)
        self._decode = decode
        self._records = _Records(
            self._one, len(self._reader), name=", ".join(files), variable=variable
        )
        self.records_read = 0

    def _one(self, i: int) -> Any:
        return self._decoded(self._reader[i])

    def _decoded(self, raw: bytes) -> Mapping[str, Any]:
        return {"record": raw} if self._decode is None else self._decode(raw)

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        """Each field's shape and dtype (per example), by name."""
        return self._records.fields

    def __len__(self) -> int:
        """The number of examples."""
        return len(self._records)

    def __getitem__(self, ids: np.ndarray | int) -> dict[str, Any]:
        """The examples ``ids`` (a 1-D int array): one array per field, a row per id."""
        if isinstance(ids, int | np.integer):  # source[i]: one example
            return example_at(self, ids)
        ids = check_ids(ids, len(self), self._records.name)
        raws = self._reader.__getitems__(ids.tolist())  # one batched read
        self.records_read += len(raws)
        decoded = [self._decoded(r) for r in raws]
        return _stack(decoded, self._records.fields, self._records.name, ids)

    def __repr__(self) -> str:
        return f"ArrayRecordSource({self._records.name}, {len(self)} records)"


def _stack(
    records: list[Mapping[str, Any]], fields: Mapping[str, FieldSpec], name: str, ids: np.ndarray
) -> dict[str, np.ndarray]:
    out = {}
    for key, spec in fields.items():
        values = [record[key] for record in records]
        if spec.dtype == OBJECT:
            column = np.empty(len(values), OBJECT)
            for row, value in enumerate(values):
                column[row] = value
            out[key] = column
            continue
        try:
            column = np.stack(values) if values else np.empty((0, *spec.shape), spec.dtype)
        except ValueError:
            column = None
        if column is None or column.shape[1:] != spec.shape:
            row = next(i for i, v in enumerate(values) if np.shape(v) != spec.shape)
            raise ValueError(
                f"field {key!r} of example {int(ids[row])} in {name} has shape "
                f"{np.shape(values[row])}, example 0 has {spec.shape}; pass "
                f"variable=[{key!r}] to get it as an object array (then pad or decode it "
                "in a record_transform)."
            )
        out[key] = column.astype(spec.dtype, copy=False)
    return out
