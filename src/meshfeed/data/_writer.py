"""``write_source``: a dataset in meshfeed's folder format, by one writer or by many.

Each field's rows go to plain ``.npy`` shards of ``shard_size`` examples; a ragged field
(documents of any length) goes to two per shard, its values and its offsets. The
manifest -- lengths, fields, shards, a SHA-256 per file -- is written last, so a folder
without one is an unfinished write. Data larger than memory comes as an iterable of
records, written a shard at a time.

A dataset too large for one writer is written in parts: each worker (a process of
multiprocessing, Ray, Beam, Dask, ...) calls ``write_source(path, its_data, part=(i,
n))``, which writes a complete folder ``path/part-0000i-of-0000n``; ``open_source(path)``
opens all ``n`` parts, in order, as one source once every part's manifest exists.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from meshfeed.data._folder import FORMAT, MANIFEST, join, part_folder
from meshfeed.data._ragged import Ragged
from meshfeed.data._sources import FieldSpec, describe
from meshfeed.storage._blob import is_url, require_fsspec

Shard = dict[str, "np.ndarray | Ragged"]


class FolderWriter:
    """Writes files under a local folder or an fsspec URL."""

    def __init__(self, root: str, storage_options: Mapping[str, Any] | None) -> None:
        self.root = root
        self.storage_options = storage_options
        if is_url(root):
            self.fs, self.path = require_fsspec().core.url_to_fs(
                root, **dict(storage_options or {})
            )
        else:
            self.fs, self.path = None, root

    def write(self, relative: str, data: bytes) -> None:
        """Writes ``data`` whole or not at all: a process killed mid-write leaves no file
        (locally a temporary name renamed into place; an object store's put is atomic)."""
        self._write(relative, data)

    def etag(self, relative: str) -> str | None:
        """The ETag a store gave the object written at ``relative`` (``None`` locally, or
        where the store gives none): one request, at write time."""
        if self.fs is None:
            return None
        info = self.fs.info(f"{self.path.rstrip('/')}/{relative}")
        tag = info.get("ETag") or info.get("etag")
        return None if tag is None else str(tag)

    def _write(self, relative: str, data: bytes) -> None:
        if self.fs is None:
            target = os.path.join(self.path, relative)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            temporary = f"{target}.tmp{os.getpid()}"
            with open(temporary, "wb") as f:
                f.write(data)
            os.replace(temporary, target)
        else:
            target = f"{self.path.rstrip('/')}/{relative}"
            self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
            with self.fs.open(target, "wb") as f:
                f.write(data)

    def clear(self) -> None:
        """Removes the folder and what it holds, if it exists."""
        if self.fs is None:
            shutil.rmtree(self.path, ignore_errors=True)
        elif self.fs.exists(self.path):
            self.fs.rm(self.path, recursive=True)

    def exists(self, relative: str) -> bool:
        if self.fs is None:
            return os.path.exists(os.path.join(self.path, relative))
        return bool(self.fs.exists(f"{self.path.rstrip('/')}/{relative}"))

    def npy(self, relative: str, array: np.ndarray) -> dict[str, Any]:
        """Writes ``array`` as ``.npy``; returns its manifest entry: what a reader needs to
        read it without opening it first (its rows, where they start, its size) and what
        tells whether it changed since (its SHA-256; behind a URL, its ETag)."""
        array = np.ascontiguousarray(array)
        buffer = io.BytesIO()
        np.lib.format.write_array(buffer, array, allow_pickle=False)
        payload = buffer.getvalue()
        self.write(relative, payload)
        entry = {
            "path": relative,
            "bytes": len(payload),
            "sha256": hashlib.sha256(payload).hexdigest(),
            "rows": len(array),
            "offset": len(payload) - array.nbytes,
        }
        etag = self.etag(relative)
        if etag is not None:
            entry["etag"] = etag
        return entry


def _documents(name: str, value: Any) -> Ragged:
    """A ragged field given as a list of arrays or an object array of them."""
    try:
        return Ragged.from_list(value)
    except (TypeError, ValueError) as error:
        raise ValueError(f"field {name!r} cannot be read as documents: {error}") from None


def _column(name: str, value: Any) -> np.ndarray | Ragged:
    if isinstance(value, Ragged):
        return value
    documents = isinstance(value, list | tuple) or (
        isinstance(value, np.ndarray) and value.dtype.hasobject and value.ndim == 1
    )
    if documents and all(isinstance(v, np.ndarray | list | tuple) for v in value):
        return _documents(name, value)
    if not isinstance(value, np.ndarray) or value.ndim == 0:
        raise TypeError(
            f"field {name!r} is {type(value).__name__}; pass numpy arrays with a leading "
            "example dimension, or meshfeed.Ragged (or a list of arrays) for documents of "
            "different lengths."
        )
    return value


def _array_shards(columns: Mapping[str, np.ndarray | Ragged], shard_size: int) -> Iterable[Shard]:
    lengths = {k: len(a) for k, a in columns.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(
            f"fields have different lengths {lengths}; every field needs one row per example."
        )
    n = next(iter(lengths.values()))
    for start in range(0, n, shard_size):
        yield {k: a[start : start + shard_size] for k, a in columns.items()}


def _records_to_shards(
    records: Iterable[Mapping[str, Any]], shard_size: int, ragged: Sequence[str]
) -> Iterable[Shard]:
    specs: dict[str, FieldSpec] | None = None
    rows: list[dict[str, np.ndarray]] = []

    def shard() -> Shard:
        assert specs is not None
        out: Shard = {}
        for k in specs:
            values = [r[k] for r in rows]
            out[k] = Ragged.from_list(values) if k in ragged else np.stack(values)
        return out

    for i, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise TypeError(
                f"record {i} is a {type(record).__name__}; write_source takes a mapping of "
                "arrays or an iterable of dicts field -> value."
            )
        arrays = {k: np.asarray(v) for k, v in record.items()}
        got = {
            k: FieldSpec((None, *a.shape[1:]) if k in ragged else a.shape, a.dtype)
            for k, a in arrays.items()
        }
        if specs is None:
            specs = got
            missing = [k for k in ragged if k not in specs]
            if missing:
                raise ValueError(f"ragged={missing} names no field of the records: {list(specs)}.")
        elif got != specs:
            raise ValueError(
                f"record {i} has fields {describe(got)}, the first record {describe(specs)}; "
                "every record needs the same fields, shapes and dtypes (name variable-length "
                "fields in ragged=[...], or pad them to a fixed size first)."
            )
        rows.append(arrays)
        if len(rows) == shard_size:
            yield shard()
            rows = []
    if rows:
        yield shard()


def write_source(
    path: str | os.PathLike[str],
    data: Mapping[str, Any] | Iterable[Mapping[str, Any]],
    *,
    shard_size: int = 65_536,
    ragged: Sequence[str] = (),
    part: tuple[int, int] | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Writes ``data`` in meshfeed's folder format under ``path`` (a folder or an fsspec URL).

    Args:
      path: the folder to create; it must not hold a dataset already.
      data: a mapping field -> values (equal lengths): a numpy array, or for documents
        of different lengths a ``meshfeed.Ragged`` or a list of arrays. Or an iterable of
        records (dicts field -> value, all with the same fields, shapes and dtypes but
        for the fields named in ``ragged``), written ``shard_size`` records at a time so
        it may be larger than memory.
      shard_size: examples per shard.
      ragged: with records, the fields whose values vary in length (documents).
      part: ``(index, count)``: write part ``index`` of ``count`` written by separate
        workers, to ``path/part-<index>-of-<count>``; ``open_source(path)`` opens them
        together once all are written.
      storage_options: for a URL, the filesystem's options (``endpoint_url``, ``key``,
        ``secret``, ...), as ``open_source`` takes them.

    Returns:
      The manifest that was written.
    """
    root = os.fspath(path)
    if not isinstance(shard_size, int) or isinstance(shard_size, bool) or shard_size < 1:
        raise ValueError(f"shard_size={shard_size!r} must be an int >= 1.")
    if part is not None:
        if (
            not isinstance(part, tuple)
            or len(part) != 2
            or not all(isinstance(x, int) for x in part)
            or not 0 <= part[0] < part[1]
        ):
            raise ValueError(
                f"part={part!r} must be (index, count) with 0 <= index < count, e.g. part=(0, 4)."
            )
        root = join(root, part_folder(*part))
    writer = FolderWriter(root, storage_options)
    if writer.exists(MANIFEST):
        raise FileExistsError(
            f"{join(root, MANIFEST)} exists: {root} already holds a dataset; write to a "
            "new folder or delete it first."
        )
    if isinstance(data, Mapping):
        if not data:
            raise ValueError("data is an empty mapping; pass at least one field.")
        columns = {str(name): _column(str(name), value) for name, value in data.items()}
        shards = _array_shards(columns, shard_size)
    elif isinstance(data, Iterable) and not isinstance(data, str | bytes):
        shards = _records_to_shards(data, shard_size, list(ragged))
    else:
        raise TypeError(
            f"data is a {type(data).__name__}; pass a mapping field -> array or an "
            "iterable of dicts."
        )
    return write_folder(writer, shards)


def write_folder(
    writer: FolderWriter,
    shards: Iterable[Shard],
    *,
    extra: Mapping[str, Any] | None = None,
    allow_empty: bool = False,
) -> dict[str, Any]:
    """Writes ``shards`` under the writer's folder, then the manifest (with ``extra``'s
    entries beside its own); returns the manifest. With ``allow_empty``, no shards at
    all make a manifest of no examples (a part of a build whose records were all
    empty), which ``open_source`` passes over."""
    fields: dict[str, dict[str, Any]] = {}
    entries = []
    total = 0
    for index, shard in enumerate(shards):
        files = {}
        for name, column in shard.items():
            if column.dtype.hasobject:
                raise ValueError(
                    f"field {name!r} holds Python objects (dtype object); write_source stores "
                    "numbers only: encode the values as arrays, as documents of different "
                    "lengths if need be (meshfeed.Ragged)."
                )
            if isinstance(column, Ragged):
                shape = [None, *column.values.shape[1:]]
            else:
                shape = list(column.shape[1:])
            spec = {"shape": shape, "dtype": column.dtype.str}
            if fields.setdefault(name, spec) != spec:
                raise ValueError(f"field {name!r} changed shape or dtype at shard {index}.")
            if isinstance(column, Ragged):
                files[name] = {
                    "values": writer.npy(f"{name}/{index:05d}.values.npy", column.values),
                    "offsets": writer.npy(f"{name}/{index:05d}.offsets.npy", column.offsets),
                }
            else:
                files[name] = writer.npy(f"{name}/{index:05d}.npy", column)
        rows = len(next(iter(shard.values())))
        entries.append({"rows": rows, "files": files})
        total += rows
    if not total and not allow_empty:
        raise ValueError("data has no examples; write at least one.")
    manifest = {"format": FORMAT, "num_examples": total, "fields": fields, "shards": entries}
    manifest.update(extra or {})
    writer.write(MANIFEST, json.dumps(manifest, indent=1).encode())
    return manifest
