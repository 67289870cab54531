"""Parquet datasets: many files, read a row group at a time: ``ParquetSource``.

A Parquet dataset is many files (the Hugging Face Hub's ``data/train-00000-of-00128``
layout), each of row groups. ``ParquetSource`` numbers the rows of all files in file
order and reads, per step, the row groups holding its ids and only the chosen columns.

A host starts from the dataset's catalog (``meshfeed.catalog.json``, written by
``meshfeed index *.parquet``): every file's row groups, stamp, and the fields -- one
request, whatever the file count. A file's footer is read at its first read, when the
file is also checked against the catalog (size; ETag behind a URL) and refused by name
if it changed. Without a catalog every footer is read on open (a few requests a file),
and one line says so. Every read goes through a ``Blob`` (``BlobFile``), so local files
count against the process's open-files bound and reads behind a URL run on the store's
clock, counted like every other source's.
"""

from __future__ import annotations

import collections
import io
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from meshfeed.data._adapters import OBJECT, require
from meshfeed.data._arrow import arrow_column, arrow_spec, list_lengths, one_length, ragged_field
from meshfeed.data._catalog import catalog_dir, quoted, read_catalog, stamp
from meshfeed.data._sources import FieldSpec, check_ids, example_at, gather_by_part, locate
from meshfeed.data._store import no_catalog
from meshfeed.storage._blob import Blob
from meshfeed.storage._handles import limit_open_files
from meshfeed.storage._paths import expand_paths
from meshfeed.storage._remote import RETRY_S

T = TypeVar("T")
FOOTERS = 256  # files whose footer a source keeps read (a reader each), least recent dropped


class BlobFile(io.RawIOBase):
    """A ``Blob`` as a seekable binary file of known ``size``, for pyarrow's reader: each
    read one range of the blob (no request before the first)."""

    def __init__(self, blob: Blob, size: int) -> None:
        super().__init__()
        self.blob, self.size, self._at = blob, size, 0

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
        self._at += len(data)
        return len(data)


def file_summary(blob: Blob, size: int) -> tuple[list[int], Any]:
    """A Parquet file's row group sizes and its Arrow schema, from its footer."""
    pq = require("pyarrow.parquet", "parquet")
    meta = blob.retried(lambda: pq.ParquetFile(BlobFile(blob, size)).metadata)
    return [
        meta.row_group(i).num_rows for i in range(meta.num_row_groups)
    ], meta.schema.to_arrow_schema()


def fields_of(files: Sequence[tuple[Blob, int]], schema: Any) -> dict[str, FieldSpec]:
    """Each column's field: a list column whose rows all have one length ``k`` in every
    file (the first row group's offsets say ``k``, every row group's metadata holds
    ``rows * k`` values) reads as ``(k, ...)`` numbers, else as documents."""
    pa, pq = require("pyarrow", "parquet"), require("pyarrow.parquet", "parquet")
    fields = {name: arrow_spec(pa, schema.field(name).type) for name in schema.names}
    readers = [pq.ParquetFile(BlobFile(b, size)) for b, size in files]
    for name, spec in fields.items():
        if not (spec.ragged and len(spec.shape) == 1):
            continue
        first = next((r for r in readers if r.metadata.num_rows), None)
        if first is None:
            continue
        k = one_length(first.read_row_group(0, columns=[name]).column(name))
        if k is not None and all(_every_group_holds(r.metadata, name, k) for r in readers):
            fields[name] = FieldSpec((k,), spec.dtype)
    return fields


def _every_group_holds(meta: Any, name: str, k: int) -> bool:
    leaves = [
        j
        for j in range(meta.num_columns)
        if meta.num_row_groups and meta.row_group(0).column(j).path_in_schema.split(".")[0] == name
    ]
    if meta.num_row_groups and len(leaves) != 1:
        return False
    return all(
        meta.row_group(g).column(leaves[0]).num_values == meta.row_group(g).num_rows * k
        for g in range(meta.num_row_groups)
    )


def spec_json(spec: FieldSpec) -> dict[str, Any]:
    return {
        "shape": list(spec.shape),
        "dtype": "object" if spec.dtype == OBJECT else spec.dtype.str,
    }


def spec_of(entry: Mapping[str, Any]) -> FieldSpec:
    dtype = OBJECT if entry["dtype"] == "object" else np.dtype(entry["dtype"])
    return FieldSpec(tuple(entry["shape"]), dtype)


class ParquetSource:
    """Parquet files (local paths or fsspec URLs), read a row group at a time.

    Parquet's unit of reading is the row group, so a step reads the row groups that hold
    its ids, and only the chosen columns. A shuffled order touches many row groups per
    step; decoded row groups are kept in an LRU cache of ``cache_bytes`` so a process
    decodes each one about once per epoch when its share fits (else prefer small row
    groups, or convert with ``meshfeed.write_source``, which reads single rows).

    Numeric columns are numpy arrays; fixed-size list columns (``pa.list_(t, k)``,
    nested for more dimensions), and list columns whose rows all have one length, are
    ``[k, ...]`` arrays; variable-length lists of numbers are ``Ragged`` in the list's
    own value type; strings, binary and nested variable lists are object arrays.

    Args:
      paths: the files: paths, globs, brace patterns or URLs (``data/train-*.parquet``);
        their rows are numbered in file order (a glob's matches sorted).
      columns: the columns to read (default: all).
      cache_bytes: memory for decoded row groups (0: no cache).
      index_dir: where the catalog is, if not beside the files (``meshfeed index``).
      storage_options: for a URL, the filesystem's options (``endpoint_url``, ``key``,
        ``secret``, ...), as ``open_source`` takes them.
      retry_s: for a URL, how long the store may fail with no success before a read
        raises, as ``open_source``.
      max_open_files: the most files this process keeps open, as ``open_source``.
    """

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        columns: Sequence[str] | None = None,
        cache_bytes: int = 256 << 20,
        index_dir: str | os.PathLike[str] | None = None,
        storage_options: Mapping[str, Any] | None = None,
        retry_s: float = RETRY_S,
        max_open_files: int | None = None,
    ) -> None:
        require("pyarrow.parquet", "parquet")
        limit_open_files(max_open_files)
        self._args = (paths, columns, cache_bytes, index_dir, storage_options, retry_s)
        patterns = [os.fspath(paths)] if isinstance(paths, str | os.PathLike) else list(paths)
        root = None if index_dir is None else os.fspath(index_dir)
        found = read_catalog(
            [os.fspath(p) for p in patterns], kind="parquet", index_dir=root,
            storage_options=storage_options,
        )  # fmt: skip
        if found is not None:  # one request: every file's row groups, the fields
            self.paths = [e["path"] for e in found[1]]
            stamps = [e["meta"]["file"] for e in found[1]]
            groups = [e["meta"]["row_groups"] for e in found[1]]
            fields = {k: spec_of(v) for k, v in found[2]["fields"].items()}
            self._blobs = [Blob(p, storage_options, retry_s=retry_s) for p in self.paths]
            for blob, stamp in zip(self._blobs, stamps, strict=True):
                blob.expect(int(stamp["size"]), etag=stamp.get("etag"))
            self._sizes = [int(s["size"]) for s in stamps]
        else:
            self.paths = expand_paths(paths, storage_options, what="paths")
            where = catalog_dir([os.fspath(p) for p in patterns], root)
            no_catalog(where, f"{len(self.paths)} Parquet files", quoted(patterns))
            self._blobs = [Blob(p, storage_options, retry_s=retry_s) for p in self.paths]
            self._sizes = [b.size() for b in self._blobs]
            summaries = [file_summary(b, s) for b, s in zip(self._blobs, self._sizes, strict=True)]
            groups = [g for g, _ in summaries]
            fields = fields_of(list(zip(self._blobs, self._sizes, strict=True)), summaries[0][1])
        self.path = (
            self.paths[0]
            if len(self.paths) == 1
            else f"{self.paths[0]} and {len(self.paths) - 1} more"
        )
        self._columns = list(columns) if columns is not None else list(fields)
        unknown = [c for c in self._columns if c not in fields]
        if unknown:
            raise ValueError(
                f"columns={unknown} are not columns of {self.path}; it has {list(fields)}."
            )
        self._fields = {c: fields[c] for c in self._columns}
        self._groups = [(f, g) for f, sizes in enumerate(groups) for g in range(len(sizes))]
        self._starts = np.cumsum([0, *(n for sizes in groups for n in sizes)])
        self._n = int(self._starts[-1])
        self.row_groups_read = 0
        self._cache_bytes = cache_bytes
        self._cache: collections.OrderedDict[int, dict[str, Any]] = collections.OrderedDict()
        self._cached = 0
        self._readers: collections.OrderedDict[int, Any] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._lengths: dict[str, np.ndarray] = {}

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        """Each field's shape and dtype (per example), by name."""
        return self._fields

    def __len__(self) -> int:
        """The number of examples."""
        return self._n

    def __getstate__(self) -> dict[str, Any]:  # Ray workers open the files themselves
        return {"args": self._args}

    def __setstate__(self, state: dict[str, Any]) -> None:
        paths, columns, cache_bytes, index_dir, storage_options, retry_s = state["args"]
        self.__init__(  # type: ignore[misc]
            paths, columns=columns, cache_bytes=cache_bytes, index_dir=index_dir,
            storage_options=storage_options, retry_s=retry_s,
        )  # fmt: skip

    def _reader(self, f: int) -> Any:
        """File ``f``'s reader, its footer read at its first use (a few kept)."""
        if f in self._readers:
            self._readers.move_to_end(f)
            return self._readers[f]
        pq = require("pyarrow.parquet", "parquet")
        blob = self._blobs[f]
        reader = blob.retried(lambda: pq.ParquetFile(BlobFile(blob, self._sizes[f])))
        self._readers[f] = reader
        while len(self._readers) > FOOTERS:
            self._readers.popitem(last=False)
        return reader

    def _read(self, f: int, g: int, columns: list[str]) -> Any:
        return self._blobs[f].retried(lambda: self._reader(f).read_row_group(g, columns=columns))

    def _group(self, i: int) -> dict[str, Any]:
        with self._lock:  # one reader and one cache, for every reading thread
            if i in self._cache:
                self._cache.move_to_end(i)
                return self._cache[i]
            table = self._read(*self._groups[i], self._columns)
            self.row_groups_read += 1
            group = {n: arrow_column(table.column(n), spec) for n, spec in self._fields.items()}
            size = sum(a.nbytes for a in group.values())
            if size <= self._cache_bytes:
                self._cache[i] = group
                self._cached += size
                while self._cached > self._cache_bytes:
                    _, dropped = self._cache.popitem(last=False)
                    self._cached -= sum(a.nbytes for a in dropped.values())
            return group

    def __getitem__(self, ids: np.ndarray | int) -> dict[str, Any]:
        """The examples ``ids`` (a 1-D int array): one array per field, a row per id."""
        if isinstance(ids, int | np.integer):  # source[i]: one example
            return example_at(self, ids)
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
        ragged_field(self._fields, field, self.path)
        if field not in self._lengths:
            with self._lock:
                parts = [
                    list_lengths(self._read(f, g, [field]).column(field)) for f, g in self._groups
                ]
            self._lengths[field] = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return self._lengths[field]

    def __repr__(self) -> str:
        files = len(self.paths)
        return f"ParquetSource({self.path!r}, {self._n} rows in {files} files; {self._columns})"


def catalog_entries(
    paths: Sequence[str], storage_options: Mapping[str, Any] | None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The catalog of Parquet files: each file's stamp and row groups, and the fields
    over all of them (every footer read once, here)."""
    blobs = [Blob(p, storage_options) for p in paths]
    sizes = [b.size() for b in blobs]
    summaries = [file_summary(b, s) for b, s in zip(blobs, sizes, strict=True)]
    schema = summaries[0][1]
    for path, (_, other) in zip(paths, summaries, strict=True):
        if not other.equals(schema):
            raise ValueError(
                f"{path} has another schema than {paths[0]}; catalog files of one schema."
            )
    fields = fields_of(list(zip(blobs, sizes, strict=True)), schema)
    entries = [
        {"path": p, "meta": {"file": stamp(p, storage_options), "samples": sum(g), "row_groups": g}}
        for p, (g, _) in zip(paths, summaries, strict=True)
    ]
    return entries, {"fields": {k: spec_json(v) for k, v in fields.items()}}
