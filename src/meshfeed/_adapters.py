"""Sources over the formats and libraries people keep data in.

Each adapter is a ``Source``: it reads only the ids the loader asks for, and imports its
library only when built (the error names the extra to install). Fixed-size values come
back as numpy arrays with a leading example dimension. **Variable-length values** (token
lists of different lengths, encoded images, strings) come back as object arrays, one
Python value per example (``bytes``, ``str`` or a 1-D numpy array), so nothing is cut
or padded behind the user's back; a ``record_transform`` (decode, crop, pad) or a
``transform`` turns them into fixed-size arrays before they reach devices, and the
loader says so if one reaches it untransformed.
"""

from __future__ import annotations

import collections
import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from meshfeed._files import Blob, is_url
from meshfeed._sources import FieldSpec, check_ids, gather_by_part, locate

OBJECT = np.dtype(object)


def _require(module: str, extra: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(
            f"this source needs {module.split('.')[0]}: pip install 'meshfeed[{extra}]'."
        ) from None


class _Records:
    """A source built from per-example records (dicts of values)."""

    def __init__(
        self, get: Callable[[int], Any], n: int, *, name: str, variable: Sequence[str]
    ) -> None:
        if n == 0:
            raise ValueError(f"{name} has no examples.")
        self._get, self._n, self.name = get, n, name
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
        return self._fields

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, ids: np.ndarray) -> dict[str, np.ndarray]:
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
        _require("grain", "grain")
        super().__init__(
            dataset.__getitem__, len(dataset), name=type(dataset).__name__, variable=variable
        )


class TorchSource(_Records):
    """A map-style PyTorch ``Dataset`` (``len``, ``[i]``); tensors become numpy arrays.

    Args:
      dataset: each element a dict, a tuple (fields ``"0"``, ``"1"``, ...) or one value
        (field ``"x"``).
      variable: fields to return as object arrays (values that change shape).
    """

    def __init__(self, dataset: Any, *, variable: Sequence[str] = ()) -> None:
        _require("torch", "torch")
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
        module = _require("array_record.python.array_record_data_source", "arrayrecord")
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
        return self._records.fields

    def __len__(self) -> int:
        return len(self._records)

    def __getitem__(self, ids: np.ndarray) -> dict[str, np.ndarray]:
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


class HFSource:
    """A Hugging Face ``datasets.Dataset``, read in numpy format, only the rows asked for.

    Fixed-size features (``Value``, ``Array2D``..``Array5D``, ``List``/``Sequence`` with a
    length) are numpy arrays; variable-length lists, strings and binary values are
    object arrays.

    Args:
      dataset: a ``datasets.Dataset`` (not an ``IterableDataset``: it needs random access).
      columns: the columns to read (default: all).
    """

    def __init__(self, dataset: Any, *, columns: Sequence[str] | None = None) -> None:
        datasets = _require("datasets", "hf")
        if not isinstance(dataset, datasets.Dataset):
            raise TypeError(
                f"HFSource takes a datasets.Dataset, got {type(dataset).__name__} (an "
                "IterableDataset or DatasetDict has no random access; pick a split)."
            )
        names = list(columns) if columns is not None else list(dataset.column_names)
        self._dataset = dataset.select_columns(names).with_format("numpy")
        self._fields = {n: _hf_spec(dataset.features[n], n) for n in names}
        self._n = len(dataset)

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        return self._fields

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        ids = check_ids(ids, self._n, "HFSource")
        rows = self._dataset[ids]
        out = {}
        for name, spec in self._fields.items():
            value = rows[name]
            if spec.dtype == OBJECT:
                array = np.empty(len(ids), OBJECT)
                array[:] = list(value)
                out[name] = array
            else:
                out[name] = np.asarray(value, dtype=spec.dtype).reshape(len(ids), *spec.shape)
        return out

    def __repr__(self) -> str:
        return f"HFSource({self._n} examples; {list(self._fields)})"


def _hf_spec(feature: Any, name: str) -> FieldSpec:
    kind = type(feature).__name__
    if kind == "Value":
        dtype = str(feature.dtype)
        if dtype in ("string", "large_string", "binary", "large_binary"):
            return FieldSpec((), OBJECT)
        return FieldSpec((), np.dtype("bool" if dtype == "bool" else dtype))
    if kind == "ClassLabel":
        return FieldSpec((), np.dtype(np.int64))
    if kind.startswith("Array") and kind[5:6].isdigit():
        if None in feature.shape[1:] or feature.shape[0] is None:
            return FieldSpec((), OBJECT)
        return FieldSpec(tuple(feature.shape), np.dtype(feature.dtype))
    if kind in ("Sequence", "List", "LargeList"):
        length = getattr(feature, "length", -1)
        inner = getattr(feature, "feature", None)
        if length is None or length < 0 or inner is None:
            return FieldSpec((), OBJECT)
        sub = _hf_spec(inner, name)
        if sub.dtype == OBJECT:
            return FieldSpec((), OBJECT)
        return FieldSpec((length, *sub.shape), sub.dtype)
    return FieldSpec((), OBJECT)


class ParquetSource:
    """A Parquet file (local path or fsspec URL), read a row group at a time.

    Parquet's unit of reading is the row group, so a step reads the row groups that hold
    its ids, and only the chosen columns. A shuffled order touches many row groups per
    step; decoded row groups are kept in an LRU cache of ``cache_bytes`` so a process
    decodes each one about once per epoch when its share fits (else prefer small row
    groups, or convert with ``meshfeed.write_source``, which reads single rows).

    Numeric columns are numpy arrays; fixed-size list columns (``pa.list_(t, k)``,
    nested for more dimensions) are ``[k, ...]`` arrays; variable-length lists, strings
    and binary columns are object arrays.

    Args:
      path: the file.
      columns: the columns to read (default: all).
      cache_bytes: memory for decoded row groups (0: no cache).
    """

    def __init__(
        self, path: str, *, columns: Sequence[str] | None = None, cache_bytes: int = 256 << 20
    ) -> None:
        pq = _require("pyarrow.parquet", "parquet")
        pa = _require("pyarrow", "parquet")
        self.path = str(path)
        # Local files through pyarrow's own reader; URLs through fsspec.
        self._file = pq.ParquetFile(Blob(self.path).open() if is_url(self.path) else self.path)
        schema = self._file.schema_arrow
        self._columns = list(columns) if columns is not None else list(schema.names)
        self._fields = {c: _arrow_spec(pa, schema.field(c).type) for c in self._columns}
        meta = self._file.metadata
        sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        self._starts = np.cumsum([0, *sizes])
        self._n = int(self._starts[-1])
        self.row_groups_read = 0
        self._cache_bytes = cache_bytes
        self._cache: collections.OrderedDict[int, dict[str, np.ndarray]] = collections.OrderedDict()
        self._cached = 0

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        return self._fields

    def __len__(self) -> int:
        return self._n

    def _group(self, g: int) -> dict[str, np.ndarray]:
        if g in self._cache:
            self._cache.move_to_end(g)
            return self._cache[g]
        table = self._file.read_row_group(g, columns=self._columns)
        self.row_groups_read += 1
        group = {n: _arrow_column(table.column(n), spec) for n, spec in self._fields.items()}
        size = sum(a.nbytes for a in group.values())
        if size <= self._cache_bytes:
            self._cache[g] = group
            self._cached += size
            while self._cached > self._cache_bytes:
                _, dropped = self._cache.popitem(last=False)
                self._cached -= sum(a.nbytes for a in dropped.values())
        return group

    def __getitem__(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        ids = check_ids(ids, self._n, self.path)
        group, local = locate(self._starts, ids)
        return gather_by_part(
            group,
            local,
            self._fields,
            lambda g, rows: {n: v[rows] for n, v in self._group(g).items()},
        )

    def __repr__(self) -> str:
        return f"ParquetSource({self.path!r}, {self._n} rows; {self._columns})"


def _arrow_spec(pa: Any, arrow_type: Any) -> FieldSpec:
    shape: list[int] = []
    while pa.types.is_fixed_size_list(arrow_type):
        shape.append(arrow_type.list_size)
        arrow_type = arrow_type.value_type
    try:
        dtype = np.dtype(arrow_type.to_pandas_dtype())
    except (NotImplementedError, TypeError):
        return FieldSpec((), OBJECT)
    if dtype == OBJECT or dtype.kind not in "biuf":
        return FieldSpec((), OBJECT)
    return FieldSpec(tuple(shape), dtype)


def _arrow_column(column: Any, spec: FieldSpec) -> np.ndarray:
    n = len(column)
    if spec.dtype == OBJECT:
        array = np.empty(n, OBJECT)
        values = column.to_pylist()
        array[:] = [v if isinstance(v, bytes | str) else np.asarray(v) for v in values]
        return array
    flat = column.combine_chunks()
    for _ in spec.shape:
        flat = flat.flatten()
    return (
        flat.to_numpy(zero_copy_only=False).astype(spec.dtype, copy=False).reshape(n, *spec.shape)
    )
