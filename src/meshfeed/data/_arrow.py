"""Arrow-backed data: Hugging Face datasets, and the Arrow columns Parquet reads give.

Both keep columns in Arrow, where a variable-length list column is already flat values
plus offsets: those come back as ``Ragged`` in the column's own value type (an
``int32`` token list stays ``int32``), and ``lengths(field)`` reads them from the
offsets. Fixed-size values are numpy arrays (fixed-size lists become trailing
dimensions); strings, binary values and nested variable lists are object arrays, one
Python value per example.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from meshfeed.data._adapters import OBJECT, require
from meshfeed.data._ragged import Ragged
from meshfeed.data._sources import FieldSpec, check_ids, example_at

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


def list_lengths(column: Any) -> np.ndarray:
    compute = require("pyarrow.compute", "parquet")
    lengths = compute.list_value_length(column).to_numpy(zero_copy_only=False)
    return np.nan_to_num(lengths.astype(np.float64)).astype(np.int64)  # a null list: 0


def ragged_field(fields: Mapping[str, FieldSpec], field: str, what: str) -> None:
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

    def __getitem__(self, ids: np.ndarray | int) -> dict[str, Any]:
        """The examples ``ids`` (a 1-D int array): one array per field, a row per id."""
        if isinstance(ids, int | np.integer):  # source[i]: one example
            return example_at(self, ids)
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
        ragged_field(self._fields, field, "this HFSource")
        assert self._arrow is not None
        return list_lengths(self._arrow[field])

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
