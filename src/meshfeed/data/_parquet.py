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
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from meshfeed.data._adapters import require
from meshfeed.data._arrow import ArrowColumn, list_lengths, ragged_field
from meshfeed.data._nulls import Fill, check_fill, needs_fill, refused, valid_name, with_valid
from meshfeed.data._parquet_files import open_files, open_parquet
from meshfeed.data._sources import FieldSpec, check_ids, example_at, gather_by_part, locate
from meshfeed.storage._file_errors import BadFileError, named
from meshfeed.storage._handles import limit_open_files
from meshfeed.storage._remote import RETRY_S

T = TypeVar("T")
FOOTERS = 256  # files whose footer a source keeps read (a reader each), least recent dropped


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
    own value type; strings, binary, lists of lists, maps and structs are object arrays
    of Python values (``str``, ``bytes``, ``list``, ``dict``; a map as a list of
    ``(key, value)`` pairs; ``None`` for a null).

    A null in a number or boolean column is never read as a number: floats read it as
    NaN; ``fill=`` reads it as a value of yours, with a ``<column>_valid`` field; else
    an integer or boolean column with nulls is refused, at open where the files'
    statistics count them, or at the read of a row that holds one (a bad record, which
    ``on_error="skip"`` skips). A null list reads as an empty document.

    An error reading a file names it and the row group (``BadFileError``, the
    library's error as its cause); an encrypted file is refused by name.

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
      fill: ``{column: value}``: nulls in these number or boolean columns read as
        ``value``, with a ``<column>_valid`` field, ``False`` where the file holds a null.
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
        fill: Fill | None = None,
    ) -> None:
        require("pyarrow.parquet", "parquet")
        limit_open_files(max_open_files)
        self._args = (paths, columns, cache_bytes, index_dir, storage_options, retry_s, fill)
        files = open_files(paths, index_dir, storage_options, retry_s)
        self.paths = files.paths
        self._blobs = files.blobs
        self._sizes = files.sizes
        self.path = (
            self.paths[0]
            if len(self.paths) == 1
            else f"{self.paths[0]} and {len(self.paths) - 1} more"
        )
        self._columns = list(columns) if columns is not None else list(files.fields)
        unknown = [c for c in self._columns if c not in files.fields]
        if unknown:
            raise ValueError(
                f"columns={unknown} are not columns of {self.path}; it has {list(files.fields)}."
            )
        self._columns_read = {c: files.fields[c] for c in self._columns}
        self._fill = check_fill(fill, self._columns_read, what=self.path)
        for name, spec in self._columns_read.items():
            count = files.nulls.get(name)
            if count and needs_fill(spec.dtype) and name not in self._fill:
                raise ValueError(f"{self.path}: {refused(name, spec.dtype, count, 'columns=')}")
        self._fields = with_valid(self._columns_read, self._fill)
        self._groups = [(f, g) for f, sizes in enumerate(files.groups) for g in range(len(sizes))]
        self._starts = np.cumsum([0, *(n for sizes in files.groups for n in sizes)])
        self._n = int(self._starts[-1])
        self.row_groups_read = 0
        self._cache_bytes = cache_bytes
        self._cache: collections.OrderedDict[int, dict[str, ArrowColumn]] = (
            collections.OrderedDict()
        )
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
        paths, columns, cache_bytes, index_dir, storage_options, retry_s, fill = state["args"]
        self.__init__(  # type: ignore[misc]
            paths,
            columns=columns,
            cache_bytes=cache_bytes,
            index_dir=index_dir,
            storage_options=storage_options,
            retry_s=retry_s,
            fill=fill,
        )

    def _reader(self, f: int) -> Any:
        """File ``f``'s reader, its footer read at its first use (a few kept)."""
        if f in self._readers:
            self._readers.move_to_end(f)
            return self._readers[f]
        reader = open_parquet(self._blobs[f], self._sizes[f])
        self._readers[f] = reader
        while len(self._readers) > FOOTERS:
            self._readers.popitem(last=False)
        return reader

    def _read(self, f: int, g: int, columns: list[str]) -> Any:
        reader = self._reader(f)  # the range reads under it retry on the store's clock
        with named(self.paths[f], f"row group {g}"):
            return reader.read_row_group(g, columns=columns)

    def _group(self, i: int) -> dict[str, ArrowColumn]:
        with self._lock:  # one reader and one cache, for every reading thread
            if i in self._cache:
                self._cache.move_to_end(i)
                return self._cache[i]
            f, g = self._groups[i]
            table = self._read(f, g, self._columns)
            self.row_groups_read += 1
            with named(self.paths[f], f"row group {g}"):
                group = {
                    n: ArrowColumn(table.column(n), spec, self._fill.get(n))
                    for n, spec in self._columns_read.items()
                }
            size = sum(c.nbytes for c in group.values())
            if size <= self._cache_bytes:
                self._cache[i] = group
                self._cached += size
                while self._cached > self._cache_bytes:
                    _, dropped = self._cache.popitem(last=False)
                    self._cached -= sum(c.nbytes for c in dropped.values())
            return group

    def _take(self, i: int, rows: np.ndarray) -> dict[str, Any]:
        """Rows of row group ``i`` (and the validity of filled columns); a row holding
        a null no value stands for is refused, naming it."""
        (f, g), out = self._groups[i], {}
        for name, column in self._group(i).items():
            bad = column.nulls_in(rows)
            if len(bad):
                example = int(self._starts[i] + rows[bad[0]])
                what = refused(name, column.spec.dtype, None, "columns=")
                raise BadFileError(f"{self.paths[f]}, row group {g} (example {example}): {what}")
            with named(self.paths[f], f"row group {g}, column {name!r}"):
                out[name], valid = column.take(rows)
            if valid is not None:
                out[valid_name(name)] = valid
        return out

    def __getitem__(self, ids: np.ndarray | int) -> dict[str, Any]:
        """The examples ``ids`` (a 1-D int array): one array per field, a row per id."""
        if isinstance(ids, int | np.integer):  # source[i]: one example
            return example_at(self, ids)
        ids = check_ids(ids, self._n, self.path)
        group, local = locate(self._starts, ids)
        return gather_by_part(group, local, self._fields, self._take)

    def origin(self, index: int) -> str:
        """Where example ``index`` is, for messages: ``<file>, row group G, row R``."""
        i = int(np.searchsorted(self._starts, index, side="right")) - 1
        f, g = self._groups[i]
        return f"{self.paths[f]}, row group {g}, row {index - int(self._starts[i])}"

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
