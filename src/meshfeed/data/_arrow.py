"""Sources over Arrow-backed data: Parquet files and Hugging Face datasets.

Both keep columns in Arrow, where a variable-length list column is already flat values
plus offsets: those come back as ``Ragged`` in the column's own value type (an
``int32`` token list stays ``int32``), and ``lengths(field)`` reads them from the
offsets. Fixed-size values are numpy arrays (fixed-size lists become trailing
dimensions); strings, binary values and nested variable lists are object arrays, one
Python value per example.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from meshfeed.data._adapters import OBJECT, require
from meshfeed.data._ragged import Ragged
from meshfeed.data._sources import FieldSpec, check_ids, gather_by_part, locate
from meshfeed.storage._blob import Blob, is_url
from meshfeed.storage._remote import RETRY_S

T = TypeVar("T")


def arrow_spec(pa: Any, arrow_type: Any) -> FieldSpec:
    """The field an Arrow type reads as."""
    ragged = pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)
    if ragged:
        arrow_type = arrow_type.value_type
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
    return FieldSpec((None, *shape) if ragged else tuple(shape), dtype)


def arrow_column(column: Any, spec: FieldSpec) -> np.ndarray | Ragged:
    """An Arrow array (or chunked array) as ``spec`` says: numpy, ``Ragged`` or objects."""
    n = len(column)
    if spec.dtype == OBJECT:
        array = np.empty(n, OBJECT)
        values = column.to_pylist()
        array[:] = [v if isinstance(v, bytes | str) else np.asarray(v) for v in values]
        return array
    flat = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    if not spec.ragged and str(flat.type).startswith(("list<", "large_list<")):
        # a list column whose rows all have one length (HFSource, ParquetSource say so)
        lengths = np.diff(np.asarray(flat.offsets, np.int64))
        bad = np.flatnonzero(lengths != spec.shape[0])
        if len(bad) or flat.null_count:
            detail = (
                f"row {int(bad[0])} holds {int(lengths[bad[0]])}" if len(bad) else "a row is null"
            )
            raise ValueError(
                f"a list column read as {spec.shape[0]} values a row has a row of another "
                f"length ({detail}); cast it to a variable-length list to read it as Ragged."
            )
        return _numbers(flat.flatten(), n * spec.shape[0], (), spec.dtype).reshape(n, *spec.shape)
    if not spec.ragged:
        return _numbers(flat, n, spec.shape, spec.dtype)
    offsets = np.asarray(flat.offsets, np.int64)
    total = int(offsets[-1] - offsets[0])
    values = flat.values.slice(int(offsets[0]), total)
    return Ragged(_numbers(values, total, spec.shape[1:], spec.dtype), offsets - offsets[0])


def _numbers(flat: Any, n: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    for _ in shape:  # fixed-size lists: one level a dimension
        flat = flat.flatten()
    return flat.to_numpy(zero_copy_only=False).astype(dtype, copy=False).reshape(n, *shape)


def one_length(column: Any) -> int | None:
    """The length of every list in an Arrow list column, if they all have one (read from
    the offsets; no values are read), else ``None``."""
    chunks = getattr(column, "chunks", [column])
    found: set[int] = set()
    for chunk in chunks:
        if chunk.null_count:
            return None
        found.update(np.unique(np.diff(np.asarray(chunk.offsets, np.int64))).tolist())
        if len(found) > 1:
            return None
    return found.pop() if len(found) == 1 and 0 not in found else None


def _list_lengths(column: Any) -> np.ndarray:
    compute = require("pyarrow.compute", "parquet")
    lengths = compute.list_value_length(column).to_numpy(zero_copy_only=False)
    return np.nan_to_num(lengths.astype(np.float64)).astype(np.int64)  # a null list: 0


def _ragged_field(fields: Mapping[str, FieldSpec], field: str, what: str) -> None:
    if field not in fields or not fields[field].ragged:
        ragged = [k for k, s in fields.items() if s.ragged]
        raise ValueError(
            f"lengths({field!r}): that is not a ragged field of {what}; its ragged fields "
            f"are {ragged}."
        )


class HFSource:
    """A Hugging Face ``datasets.Dataset``, reading only the rows asked for.

    Fixed-size features (``Value``, ``Array2D``..``Array5D``, ``List``/``Sequence`` with a
    length) are numpy arrays; variable-length lists of numbers are ``Ragged`` (in the
    feature's own dtype); strings, binary values and nested variable lists are object
    arrays.

    Args:
      dataset: a ``datasets.Dataset`` (not an ``IterableDataset``: it needs random access).
      columns: the columns to read (default: all).
    """

    def __init__(self, dataset: Any, *, columns: Sequence[str] | None = None) -> None:
        datasets = require("datasets", "hf")
        if not isinstance(dataset, datasets.Dataset):
            raise TypeError(
                f"HFSource takes a datasets.Dataset, got {type(dataset).__name__} (an "
                "IterableDataset or DatasetDict has no random access; pick a split)."
            )
        names = list(columns) if columns is not None else list(dataset.column_names)
        self._fields = {n: hf_spec(dataset.features[n]) for n in names}
        for name, spec in self._fields.items():
            # Lists whose rows all have one length (a numpy array made into a dataset)
            # are fixed-shape fields; Arrow's offsets tell, without reading values.
            if spec.ragged and len(spec.shape) == 1:
                k = one_length(dataset.data.column(name))
                if k is not None:
                    self._fields[name] = FieldSpec((k,), spec.dtype)
        fixed = [n for n in names if not self._fields[n].ragged]
        ragged = [n for n in names if self._fields[n].ragged]
        self._numpy = dataset.select_columns(fixed).with_format("numpy") if fixed else None
        self._arrow = dataset.select_columns(ragged).with_format("arrow") if ragged else None
        self._n = len(dataset)

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        """Each field's shape and dtype (per example), by name."""
        return self._fields

    def __len__(self) -> int:
        """The number of examples."""
        return self._n

    def __getitem__(self, ids: np.ndarray) -> dict[str, Any]:
        """The examples ``ids`` (a 1-D int array): one array per field, a row per id."""
        ids = check_ids(ids, self._n, "HFSource")
        out: dict[str, Any] = {}
        rows = self._numpy[ids] if self._numpy is not None else {}
        table = self._arrow[ids] if self._arrow is not None else None
        for name, spec in self._fields.items():
            if spec.ragged:
                assert table is not None
                out[name] = arrow_column(table.column(name), spec)
            elif spec.dtype == OBJECT:
                array = np.empty(len(ids), OBJECT)
                array[:] = list(rows[name])
                out[name] = array
            else:
                values = rows[name]
                if values.dtype == OBJECT:  # lists of one length, as an array of arrays
                    values = np.stack(list(values)) if len(values) else values
                out[name] = np.asarray(values, dtype=spec.dtype).reshape(len(ids), *spec.shape)
        return out

    def lengths(self, field: str) -> np.ndarray:
        """Every document's length in the ragged ``field``, from Arrow's offsets."""
        _ragged_field(self._fields, field, "this HFSource")
        assert self._arrow is not None
        return _list_lengths(self._arrow[field])

    def __repr__(self) -> str:
        return f"HFSource({self._n} examples; {list(self._fields)})"


def hf_spec(feature: Any) -> FieldSpec:
    """The field a Hugging Face feature reads as."""
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
        if inner is None:
            return FieldSpec((), OBJECT)
        sub = hf_spec(inner)
        if sub.dtype == OBJECT or sub.ragged:
            return FieldSpec((), OBJECT)
        if length is None or length < 0:
            return FieldSpec((None, *sub.shape), sub.dtype)  # documents of any length
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
    nested for more dimensions) are ``[k, ...]`` arrays; variable-length lists of
    numbers are ``Ragged`` in the list's own value type; strings, binary and nested
    variable lists are object arrays.

    Args:
      path: the file.
      columns: the columns to read (default: all).
      cache_bytes: memory for decoded row groups (0: no cache).
      storage_options: for a URL, the filesystem's options (``endpoint_url``, ``key``,
        ``secret``, ...), as ``open_source`` takes them.
      retry_s: for a URL, how long the store may fail with no success before a read
        raises, as ``open_source``.
    """

    def __init__(
        self,
        path: str,
        *,
        columns: Sequence[str] | None = None,
        cache_bytes: int = 256 << 20,
        storage_options: Mapping[str, Any] | None = None,
        retry_s: float = RETRY_S,
    ) -> None:
        pq = require("pyarrow.parquet", "parquet")
        pa = require("pyarrow", "parquet")
        self._args = (str(path), columns, cache_bytes, storage_options, retry_s)
        self.path = str(path)
        remote = is_url(self.path)
        self._blob = Blob(self.path, storage_options, retry_s=retry_s) if remote else None
        # Local files through pyarrow's own reader; URLs through fsspec, each read of a
        # column chunk one request (fsspec's read-ahead would fetch megabytes past it).
        blob = self._blob
        self._file = self._retried(
            lambda: pq.ParquetFile(blob.open(cache_type="none") if blob else self.path)
        )
        schema = self._file.schema_arrow
        self._columns = list(columns) if columns is not None else list(schema.names)
        self._fields = {c: arrow_spec(pa, schema.field(c).type) for c in self._columns}
        meta = self._file.metadata
        sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        for name, spec in self._fields.items():
            if spec.ragged and len(spec.shape) == 1 and sizes and sizes[0]:
                k = self._one_length(name, sizes)
                if k is not None:
                    self._fields[name] = FieldSpec((k,), spec.dtype)
        self._starts = np.cumsum([0, *sizes])
        self._n = int(self._starts[-1])
        self.row_groups_read = 0
        self._cache_bytes = cache_bytes
        self._cache: collections.OrderedDict[int, dict[str, Any]] = collections.OrderedDict()
        self._cached = 0
        self._lock = threading.Lock()
        self._lengths: dict[str, np.ndarray] = {}

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        """Each field's shape and dtype (per example), by name."""
        return self._fields

    def __len__(self) -> int:
        """The number of examples."""
        return self._n

    def __getstate__(self) -> dict[str, Any]:  # Ray workers open the file themselves
        return {"args": self._args}

    def __setstate__(self, state: dict[str, Any]) -> None:
        path, columns, cache_bytes, storage_options, retry_s = state["args"]
        self.__init__(  # type: ignore[misc]
            path,
            columns=columns,
            cache_bytes=cache_bytes,
            storage_options=storage_options,
            retry_s=retry_s,
        )

    def _one_length(self, name: str, sizes: list[int]) -> int | None:
        """``k`` if the list column ``name`` looks ``k`` long in every row: the first row
        group's offsets say so, and every row group holds ``rows * k`` values (metadata
        only); each row group read is checked again (``arrow_column``)."""
        first = self._retried(lambda: self._file.read_row_group(0, columns=[name]))
        k = one_length(first.column(name))
        if k is None:
            return None
        meta = self._file.metadata
        leaves = [
            j
            for j in range(meta.num_columns)
            if meta.row_group(0).column(j).path_in_schema.split(".")[0] == name
        ]
        if len(leaves) != 1:
            return None
        for g, rows in enumerate(sizes):
            if meta.row_group(g).column(leaves[0]).num_values != rows * k:
                return None
        return k

    def _retried(self, call: Callable[[], T]) -> T:
        return call() if self._blob is None else self._blob.retried(call)

    def _group(self, g: int) -> dict[str, Any]:
        with self._lock:  # one file reader and one cache, for every reading thread
            return self._group_locked(g)

    def _group_locked(self, g: int) -> dict[str, Any]:
        if g in self._cache:
            self._cache.move_to_end(g)
            return self._cache[g]
        table = self._retried(lambda: self._file.read_row_group(g, columns=self._columns))
        self.row_groups_read += 1
        group = {n: arrow_column(table.column(n), spec) for n, spec in self._fields.items()}
        size = sum(a.nbytes for a in group.values())
        if size <= self._cache_bytes:
            self._cache[g] = group
            self._cached += size
            while self._cached > self._cache_bytes:
                _, dropped = self._cache.popitem(last=False)
                self._cached -= sum(a.nbytes for a in dropped.values())
        return group

    def __getitem__(self, ids: np.ndarray) -> dict[str, Any]:
        """The examples ``ids`` (a 1-D int array): one array per field, a row per id."""
        ids = check_ids(ids, self._n, self.path)
        group, local = locate(self._starts, ids)
        return gather_by_part(
            group,
            local,
            self._fields,
            lambda g, rows: {n: v[rows] for n, v in self._group(g).items()},
        )

    def lengths(self, field: str) -> np.ndarray:
        """Every document's length in the ragged ``field``, from each row group's offsets."""
        _ragged_field(self._fields, field, self.path)
        if field not in self._lengths:
            groups = range(self._file.metadata.num_row_groups)
            self._lengths[field] = np.concatenate(
                [
                    _list_lengths(
                        self._retried(
                            lambda g=g: self._file.read_row_group(g, columns=[field])
                        ).column(field)
                    )
                    for g in groups
                ]
            )
        return self._lengths[field]

    def __repr__(self) -> str:
        return f"ParquetSource({self.path!r}, {self._n} rows; {self._columns})"
