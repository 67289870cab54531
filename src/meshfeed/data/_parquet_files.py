"""A Parquet file's footer: opened without harm, summarized, catalogued.

Everything ``ParquetSource`` and ``meshfeed index`` learn of a Parquet file before its
data: the footer read through a ``Blob`` (``BlobFile``), refused by name if the file is
encrypted or damaged (``open_parquet``); each file's row groups and the nulls its
statistics count (``file_summary``); the fields of many files (``fields_of``), and the
catalog entries that keep all of it in one object.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from meshfeed.data._adapters import OBJECT, require
from meshfeed.data._arrow import arrow_spec, one_length
from meshfeed.data._catalog import catalog_dir, quoted, read_catalog, stamp
from meshfeed.data._sources import FieldSpec
from meshfeed.data._store import no_catalog
from meshfeed.storage._blob import Blob
from meshfeed.storage._file_errors import BadFileError, named
from meshfeed.storage._paths import expand_paths


class BlobFile(io.RawIOBase):
    """A ``Blob`` as a seekable binary file of known ``size``, for pyarrow's reader: each
    read one range of the blob (no request before the first)."""

    def __init__(self, blob: Blob, size: int) -> None:
        super().__init__()
        self.blob = blob
        self.size = size
        self._at = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._at

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: self.size}[whence]
        self._at = base + offset
        return self._at

    def readinto(self, buffer: Any) -> int:
        end = min(self.size, self._at + len(buffer))
        if end <= self._at:
            return 0
        data = self.blob.read(self._at, end)
        memoryview(buffer).cast("B")[: len(data)] = data
        if self._at + len(data) == self.size and len(data) >= 8:
            self.tail = bytes(data[-8:])  # the footer's length and magic, read with it
        self._at += len(data)
        return len(data)

    tail: bytes | None = None


def open_parquet(blob: Blob, size: int) -> Any:
    """A ``pyarrow.parquet.ParquetFile`` over ``blob``, its footer read, named if bad.

    An encrypted file is refused here, before anything touches its columns' metadata:
    pyarrow aborts the process (a C++ exception thrown where none may be) on the first
    column chunk of an encrypted file with a plaintext footer. Such a footer is followed
    by its signature, so its length is the metadata's plus 28 bytes.
    """
    pq = require("pyarrow.parquet", "parquet")
    handle = BlobFile(blob, size)
    encrypted = (
        f"{blob.path} is encrypted (Parquet modular encryption), which meshfeed does not "
        "read; write a decrypted copy (pyarrow.parquet.read_table(path, "
        "decryption_properties=...), then write_table) and read that."
    )
    with named(blob.path, "its footer"):
        try:
            reader = pq.ParquetFile(handle)
        except OSError as error:
            if "encrypt" in str(error).lower():
                raise BadFileError(encrypted) from error
            raise
        tail = handle.tail if handle.tail is not None else blob.read(size - 8, size)
        if tail[4:] == b"PARE" or int.from_bytes(tail[:4], "little") != (
            reader.metadata.serialized_size
        ):
            raise BadFileError(encrypted)
    return reader


def file_summary(blob: Blob, size: int) -> tuple[list[int], Any, dict[str, int | None]]:
    """A Parquet file's row group sizes, its Arrow schema, and the nulls of each plain
    column (``None``: not in the statistics), from its footer."""
    meta = open_parquet(blob, size).metadata
    with named(blob.path, "its footer"):
        schema = meta.schema.to_arrow_schema()
        return (
            [meta.row_group(i).num_rows for i in range(meta.num_row_groups)],
            schema,
            {name: _null_count(meta, name) for name in schema.names},
        )


def _null_count(meta: Any, name: str) -> int | None:
    """The nulls of a column that is one plain leaf, by its statistics (``None``: a
    nested column, whose leaf counts an empty list as a null, or no statistics)."""
    leaves = [j for j in range(meta.num_columns) if meta.schema.column(j).path == name]
    if len(leaves) != 1:
        return None
    if meta.schema.column(leaves[0]).max_definition_level == 0:
        return 0  # a required column: it cannot hold a null
    count = 0
    for g in range(meta.num_row_groups):
        chunk = _chunk(meta, g, leaves[0])
        stats = chunk.statistics if chunk.is_stats_set else None
        if stats is None or not stats.has_null_count:
            return None
        count += stats.null_count
    return count


class ParquetFiles(NamedTuple):
    """What a ``ParquetSource`` knows of its files at open: their paths, ``Blob`` and
    sizes, each file's row group sizes, the fields, and each field's nulls (``None``:
    not counted)."""

    paths: list[str]
    blobs: list[Blob]
    sizes: list[int]
    groups: list[list[int]]
    fields: dict[str, FieldSpec]
    nulls: dict[str, int | None]


def open_files(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    index_dir: str | os.PathLike[str] | None,
    storage_options: Mapping[str, Any] | None,
    retry_s: float,
) -> ParquetFiles:
    """Parquet files as a ``ParquetSource`` opens them: from their catalog, one request
    (each file then checked against it at its first read), else every footer read."""
    patterns = [os.fspath(paths)] if isinstance(paths, str | os.PathLike) else list(paths)
    root = None if index_dir is None else os.fspath(index_dir)
    found = read_catalog(
        [os.fspath(p) for p in patterns],
        kind="parquet",
        index_dir=root,
        storage_options=storage_options,
    )
    if found is not None:  # one request: every file's row groups, the fields
        named_paths = [e["path"] for e in found[1]]
        stamps = [e["meta"]["file"] for e in found[1]]
        blobs = [Blob(p, storage_options, retry_s=retry_s) for p in named_paths]
        for blob, stamp in zip(blobs, stamps, strict=True):
            blob.expect(int(stamp["size"]), etag=stamp.get("etag"))
        return ParquetFiles(
            named_paths,
            blobs,
            [int(s["size"]) for s in stamps],
            [e["meta"]["row_groups"] for e in found[1]],
            {k: spec_of(v) for k, v in found[2]["fields"].items()},
            {k: v.get("nulls") for k, v in found[2]["fields"].items()},
        )
    named_paths = expand_paths(paths, storage_options, what="paths")
    where = catalog_dir([os.fspath(p) for p in patterns], root)
    no_catalog(where, f"{len(named_paths)} Parquet files", quoted(patterns))
    blobs = [Blob(p, storage_options, retry_s=retry_s) for p in named_paths]
    sizes = [b.size() for b in blobs]
    summaries = [file_summary(b, s) for b, s in zip(blobs, sizes, strict=True)]
    fields = fields_of(list(zip(blobs, sizes, strict=True)), summaries[0][1])
    nulls = total_nulls([n for _, _, n in summaries], fields)
    return ParquetFiles(named_paths, blobs, sizes, [g for g, _, _ in summaries], fields, nulls)


def fields_of(files: Sequence[tuple[Blob, int]], schema: Any) -> dict[str, FieldSpec]:
    """Each column's field: a list column whose rows all have one length ``k`` in every
    file (the first row group's offsets say ``k``, every row group's metadata holds
    ``rows * k`` values) reads as ``(k, ...)`` numbers, else as documents."""
    pa = require("pyarrow", "parquet")
    fields = {name: arrow_spec(pa, schema.field(name).type) for name in schema.names}
    readers = [(b.path, open_parquet(b, size)) for b, size in files]
    for name, spec in fields.items():
        if not (spec.ragged and len(spec.shape) == 1):
            continue
        path, first = next(((p, r) for p, r in readers if r.metadata.num_rows), ("", None))
        if first is None:
            continue
        with named(path, f"row group 0, column {name!r}"):
            k = one_length(first.read_row_group(0, columns=[name]).column(name))
        if k is not None and all(_every_group_holds(p, r.metadata, name, k) for p, r in readers):
            fields[name] = FieldSpec((k,), spec.dtype)
    return fields


def _every_group_holds(path: str, meta: Any, name: str, k: int) -> bool:
    """Whether every row group of a list column holds ``k`` values a row (from the
    metadata: the leaf's value count)."""
    leaves = [
        j for j in range(meta.num_columns) if meta.schema.column(j).path.split(".")[0] == name
    ]
    if len(leaves) != 1:
        return False
    with named(path, "its footer"):
        return all(
            _chunk(meta, g, leaves[0]).num_values == meta.row_group(g).num_rows * k
            for g in range(meta.num_row_groups)
        )


def _chunk(meta: Any, g: int, j: int) -> Any:
    """Row group ``g``'s chunk of leaf ``j``, checked against the schema first: pyarrow
    aborts the process on some questions to a chunk whose type the schema contradicts."""
    chunk = meta.row_group(g).column(j)
    physical = meta.schema.column(j).physical_type
    if chunk.physical_type != physical:
        raise ValueError(
            f"row group {g}, column {meta.schema.column(j).path!r} holds {chunk.physical_type}"
            f" values where the schema says {physical}: the footer is corrupt."
        )
    return chunk


def spec_json(spec: FieldSpec, nulls: int | None = None) -> dict[str, Any]:
    """A field as a catalog keeps it, with its nulls where the statistics count them."""
    out: dict[str, Any] = {
        "shape": list(spec.shape),
        "dtype": "object" if spec.dtype == OBJECT else spec.dtype.str,
    }
    if nulls is not None:
        out["nulls"] = nulls
    return out


def spec_of(entry: Mapping[str, Any]) -> FieldSpec:
    dtype = OBJECT if entry["dtype"] == "object" else np.dtype(entry["dtype"])
    return FieldSpec(tuple(entry["shape"]), dtype)


def catalog_entries(
    paths: Sequence[str], storage_options: Mapping[str, Any] | None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The catalog of Parquet files: each file's stamp and row groups, and the fields
    over all of them (every footer read once, here)."""
    blobs = [Blob(p, storage_options) for p in paths]
    sizes = [b.size() for b in blobs]
    summaries = [file_summary(b, s) for b, s in zip(blobs, sizes, strict=True)]
    schema = summaries[0][1]
    for path, (_, other, _) in zip(paths, summaries, strict=True):
        if not other.equals(schema):
            raise ValueError(
                f"{path} has another schema than {paths[0]}; catalog files of one schema."
            )
    fields = fields_of(list(zip(blobs, sizes, strict=True)), schema)
    nulls = total_nulls([n for _, _, n in summaries], fields)
    entries = [
        {"path": p, "meta": {"file": stamp(p, storage_options), "samples": sum(g), "row_groups": g}}
        for p, (g, _, _) in zip(paths, summaries, strict=True)
    ]
    return entries, {"fields": {k: spec_json(v, nulls.get(k)) for k, v in fields.items()}}


def total_nulls(
    per_file: Sequence[Mapping[str, int | None]], fields: Mapping[str, FieldSpec]
) -> dict[str, int | None]:
    """Each field's nulls over every file (``None`` where a file's statistics lack them)."""
    out: dict[str, int | None] = {}
    for name in fields:
        counts = [counts.get(name) for counts in per_file]
        out[name] = None if None in counts else sum(c for c in counts if c is not None)
    return out
