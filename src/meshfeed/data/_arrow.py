"""Arrow-backed data: Hugging Face datasets, and the Arrow columns Parquet reads give.

Both keep columns in Arrow, where a variable-length list column is already flat values
plus offsets: those come back as ``Ragged`` in the column's own value type (an
``int32`` token list stays ``int32``), and ``lengths(field)`` reads them from the
offsets. Fixed-size values are numpy arrays (fixed-size lists become trailing
dimensions). Everything else -- strings, binary values, lists of lists, maps, structs --
is an object array of the Python values pyarrow's ``to_pylist`` gives (``str``,
``bytes``, ``list``, ``dict``, a map as a list of ``(key, value)`` pairs, ``None`` for a
null), made only for the rows a read takes. Nulls in number and boolean columns follow
``_nulls``: NaN for floats, else filled (``fill=``, with a ``<field>_valid`` field) or
refused, never a number the file does not hold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from meshfeed.data._adapters import OBJECT, require
from meshfeed.data._nulls import Fill, check_fill, needs_fill, refused, valid_name, with_valid
from meshfeed.data._ragged import Ragged
from meshfeed.data._sources import FieldSpec, check_ids, example_at
from meshfeed.storage._file_errors import BadFileError, named

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


class ArrowColumn:
    """One Arrow column (a row group's, a batch's) decoded as its field says, once.

    Numbers become numpy arrays or ``Ragged`` (``take`` slices them); objects stay in
    Arrow until rows are taken, so only the rows asked for become Python values, and a
    value Python cannot hold (a date past year 9999) fails only the reads of its rows.
    Nulls follow ``_nulls``: a filled field has ``valid`` beside its values; an integer
    or boolean field with nulls and no fill marks its rows in ``null_rows``, which a
    read refuses (``nulls_in``); floats hold NaN.
    """

    def __init__(self, column: Any, spec: FieldSpec, fill: np.generic | None = None) -> None:
        self.spec = spec
        self.valid: np.ndarray | Ragged | None = None
        self.null_rows: np.ndarray | None = None
        self._objects: Any = None
        flat = column.combine_chunks() if hasattr(column, "combine_chunks") else column
        n = len(flat)
        if spec.dtype == OBJECT:
            self._objects = flat
            self.values = None
            return
        if spec.ragged:
            flat, offsets = _documents(flat)
            rows = int(offsets[-1])
            trailing = spec.shape[1:]
        else:
            if str(flat.type).startswith(("list<", "large_list<")):
                _one_length(flat, spec.shape[0])  # rows of one length: a fixed dimension
            offsets = None
            rows = n
            trailing = spec.shape
        leaf, known = _leaf(flat, tuple(trailing))
        values = _numbers(leaf, spec.dtype, fill).reshape(rows, *trailing)
        if known is not None:
            known = known.reshape(values.shape)
            if fill is not None:
                self.valid = known if offsets is None else Ragged(known, offsets)
            elif needs_fill(spec.dtype):
                held = np.ones(rows, bool)
                if known.size:
                    held = np.asarray(known.reshape(rows, -1).all(axis=1))
                self.null_rows = ~held if offsets is None else _per_document(~held, offsets)
        self.values = values if offsets is None else Ragged(values, offsets)

    @property
    def nbytes(self) -> int:
        """Bytes held (Arrow's buffers, for objects)."""
        if self._objects is not None:
            return int(self._objects.nbytes)
        extra = 0 if self.valid is None else self.valid.nbytes
        return int(self.values.nbytes) + extra  # type: ignore[union-attr]

    def take(self, rows: np.ndarray) -> tuple[Any, Any]:
        """The values of ``rows``, and their validity (``None`` for an unfilled field)."""
        if self._objects is not None:
            out = np.empty(len(rows), OBJECT)
            out[:] = self._objects.take(rows).to_pylist()
            return out, None
        valid = None if self.valid is None else self.valid[rows]
        return self.values[rows], valid  # type: ignore[index]

    def nulls_in(self, rows: np.ndarray) -> np.ndarray:
        """The positions in ``rows`` of rows holding a null no value stands for."""
        if self.null_rows is None:
            return np.zeros(0, np.int64)
        return np.flatnonzero(self.null_rows[rows])


def _documents(flat: Any) -> tuple[Any, np.ndarray]:
    """A list column's values and offsets; a null list is an empty document."""
    if flat.null_count:
        compute = require("pyarrow.compute", "parquet")
        lengths = compute.list_value_length(flat).fill_null(0).to_numpy(zero_copy_only=False)
        offsets = np.zeros(len(flat) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return compute.list_flatten(flat), offsets
    offsets = np.asarray(flat.offsets, np.int64)
    total = int(offsets[-1] - offsets[0])
    return flat.values.slice(int(offsets[0]), total), offsets - offsets[0]


def _one_length(flat: Any, k: int) -> None:
    """Checks that every row of a list column read as ``k`` values a row holds ``k``."""
    lengths = np.diff(np.asarray(flat.offsets, np.int64))
    bad = np.flatnonzero(lengths != k)
    if len(bad) or flat.null_count:
        detail = f"row {int(bad[0])} holds {int(lengths[bad[0]])}" if len(bad) else "a row is null"
        raise ValueError(
            f"a list column read as {k} values a row has a row of another length "
            f"({detail}); cast it to a variable-length list to read it as Ragged."
        )


def _leaf(flat: Any, shape: tuple[int, ...]) -> tuple[Any, np.ndarray | None]:
    """The numbers under a column's fixed-size levels (one level a dimension of
    ``shape``; a null slot's values included), and which of them the file holds
    (``None``: all of them)."""
    known: np.ndarray | None = None
    for k in shape:
        if flat.null_count:
            slots = flat.is_valid().to_numpy(zero_copy_only=False)
            known = slots if known is None else known & slots
        if str(flat.type).startswith("fixed_size_list<"):
            start = flat.offset * k
        else:  # a list column whose rows all hold k values
            start = int(np.asarray(flat.offsets[:1])[0]) if len(flat) else 0
        flat = flat.values.slice(start, len(flat) * k)
        if known is not None:
            known = np.repeat(known, k)
    if flat.null_count:
        held = flat.is_valid().to_numpy(zero_copy_only=False)
        known = held if known is None else known & held
    return flat, known


def _numbers(leaf: Any, dtype: np.dtype, fill: np.generic | None) -> np.ndarray:
    if leaf.null_count:  # read past the nulls without a detour through float
        stand_in = fill if fill is not None else {"f": np.nan, "b": False}.get(dtype.kind, 0)
        leaf = leaf.fill_null(require("pyarrow", "parquet").scalar(stand_in, leaf.type))
    return leaf.to_numpy(zero_copy_only=False).astype(dtype, copy=False)


def _per_document(bad: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per document: whether any of its values is marked in ``bad``."""
    counts = np.zeros(len(bad) + 1, np.int64)
    np.cumsum(bad, out=counts[1:])
    return counts[offsets[1:]] > counts[offsets[:-1]]


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
    feature's own dtype); strings, binary values, lists of lists and structs are object
    arrays of Python values (``str``, ``bytes``, ``list``, ``dict``, ``None``).

    Args:
      dataset: a ``datasets.Dataset`` (not an ``IterableDataset``: it needs random access).
      columns: the columns to read (default: all).
      fill: ``{column: value}``: nulls in these number or boolean columns read as
        ``value``, with a ``<column>_valid`` field, ``False`` where the dataset holds a
        null. Without it an integer or boolean column with nulls is refused (at open
        when the dataset is its whole table; else at the read of a row that holds one,
        as a bad record); floats read a null as NaN.
    """

    def __init__(
        self, dataset: Any, *, columns: Sequence[str] | None = None, fill: Fill | None = None
    ) -> None:
        datasets = require("datasets", "hf")
        if not isinstance(dataset, datasets.Dataset):
            raise TypeError(
                f"HFSource takes a datasets.Dataset, got {type(dataset).__name__} (an "
                "IterableDataset or DatasetDict has no random access; pick a split)."
            )
        names = list(columns) if columns is not None else list(dataset.column_names)
        table = dataset.data
        fields = {n: hf_spec(dataset.features[n]) for n in names}
        for name, spec in fields.items():
            # Lists whose rows all have one length (a numpy array made into a dataset)
            # are fixed-shape fields; Arrow's offsets tell, without reading values.
            if spec.ragged and len(spec.shape) == 1:
                k = one_length(table.column(name))
                if k is not None:
                    fields[name] = FieldSpec((k,), spec.dtype)
        self._fill = check_fill(fill, fields, what="this dataset")
        whole = len(dataset) == table.num_rows  # the table's null counts are the rows'
        by_arrow = []
        for name, spec in fields.items():
            nulls = 0 if spec.dtype == OBJECT else nulls_held(table.column(name))
            if spec.ragged or spec.dtype == OBJECT or nulls or name in self._fill:
                by_arrow.append(name)
            if nulls and spec.shape and not _plain(table.column(name).type):
                raise ValueError(
                    f"column {name!r} of this dataset ({dataset.features[name]}) holds nulls, "
                    "which meshfeed reads only in plain and list columns; fill them first "
                    "(dataset.map) or leave the column out (columns=)."
                )
            if nulls and whole and needs_fill(spec.dtype) and name not in self._fill:
                raise ValueError(f"this dataset: {refused(name, spec.dtype, nulls, 'columns=')}")
        self._columns = fields  # as the dataset holds them; fields add the validity
        self._fields = with_valid(fields, self._fill)
        fixed = [n for n in names if n not in by_arrow]
        self._numpy = dataset.select_columns(fixed).with_format("numpy") if fixed else None
        self._arrow = dataset.select_columns(by_arrow).with_format("arrow") if by_arrow else None
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
        every = np.arange(len(ids))
        for name, spec in self._columns.items():
            if table is not None and name in table.column_names:
                column = ArrowColumn(table.column(name), spec, self._fill.get(name))
                bad = column.nulls_in(every)
                if len(bad):
                    what = refused(name, spec.dtype, None, "columns=")
                    raise BadFileError(f"this dataset, row {int(ids[bad[0]])}: {what}")
                with named("this dataset", f"column {name!r}"):
                    out[name], valid = column.take(every)
                if valid is not None:
                    out[valid_name(name)] = valid
                continue
            values = rows[name]
            if values.dtype == OBJECT:  # lists of one length, as an array of arrays
                values = np.stack(list(values)) if len(values) else values
            out[name] = np.asarray(values, dtype=spec.dtype).reshape(len(ids), *spec.shape)
        return {name: out[name] for name in self._fields}

    def lengths(self, field: str) -> np.ndarray:
        """Every document's length in the ragged ``field``, from Arrow's offsets."""
        ragged_field(self._fields, field, "this HFSource")
        assert self._arrow is not None
        return list_lengths(self._arrow[field])

    def __repr__(self) -> str:
        return f"HFSource({self._n} examples; {list(self._fields)})"


def nulls_held(column: Any) -> int:
    """The nulls among a column's values (a null variable-length list is an empty
    document, not a null; a null fixed-size list is)."""
    compute = require("pyarrow.compute", "parquet")
    count = 0
    while True:
        kind = str(column.type)
        if kind.startswith("fixed_size_list<"):
            count += column.null_count
        elif not kind.startswith(("list<", "large_list<")):
            return count + column.null_count
        column = compute.list_flatten(column)


def _plain(arrow_type: Any) -> bool:
    """Whether an Arrow type is made of plain values and lists (not an extension type)."""
    pa = require("pyarrow", "parquet")
    while (
        pa.types.is_list(arrow_type)
        or pa.types.is_large_list(arrow_type)
        or (pa.types.is_fixed_size_list(arrow_type))
    ):
        arrow_type = arrow_type.value_type
    return not isinstance(arrow_type, pa.ExtensionType)


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
