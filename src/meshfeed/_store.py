"""meshfeed's own folder format: ``.npy`` shards per field and a manifest.

::

    data/
      meshfeed.json          # lengths, fields (shape, dtype), shards, checksums
      image/00000.npy        # rows 0 .. shard_size-1 of field "image"
      image/00001.npy
      label/00000.npy
      ...

Plain ``.npy`` files, so any tool reads them; the manifest is written last, so a folder
without one is an unfinished write. ``open_source`` opens the folder (or a single
``.npy``/``.npz``) as one ``Source`` over all shards and reads each step's rows by byte
range -- ``pread`` locally, ``cat_ranges`` through fsspec for URLs -- so a process reads
its own rows and nothing else, and never downloads a shard whole. On open, every shard's
header and size are checked against the manifest (dtype, shape, truncation);
``verify=True`` also checks every byte against the manifest's SHA-256.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Iterable, Mapping
from typing import Any, cast

import numpy as np

from meshfeed._files import Blob, NpyRows, is_url, npz_members, require_fsspec
from meshfeed._sources import (
    FieldSpec,
    check_ids,
    describe,
    field_text,
    fields_text,
    gather_by_part,
    locate,
)

MANIFEST = "meshfeed.json"
FORMAT = "meshfeed.source/1"


def _join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *parts]) if is_url(root) else os.path.join(root, *parts)


class _Writer:
    """Writes files under a local folder or an fsspec URL."""

    def __init__(self, root: str) -> None:
        self.root = root
        if is_url(root):
            self.fs, self.path = require_fsspec().core.url_to_fs(root)
        else:
            self.fs, self.path = None, root

    def write(self, relative: str, data: bytes) -> None:
        if self.fs is None:
            target = os.path.join(self.path, relative)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as f:
                f.write(data)
        else:
            target = f"{self.path.rstrip('/')}/{relative}"
            self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
            with self.fs.open(target, "wb") as f:
                f.write(data)

    def exists(self, relative: str) -> bool:
        if self.fs is None:
            return os.path.exists(os.path.join(self.path, relative))
        return bool(self.fs.exists(f"{self.path.rstrip('/')}/{relative}"))


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()


def _records_to_shards(
    records: Iterable[Mapping[str, Any]], shard_size: int
) -> Iterable[dict[str, np.ndarray]]:
    specs: dict[str, FieldSpec] | None = None
    rows: list[dict[str, np.ndarray]] = []
    for i, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise TypeError(
                f"record {i} is a {type(record).__name__}; write_source takes a mapping of "
                "arrays or an iterable of dicts field -> value."
            )
        arrays = {k: np.asarray(v) for k, v in record.items()}
        got = {k: FieldSpec(a.shape, a.dtype) for k, a in arrays.items()}
        if specs is None:
            specs = got
        elif got != specs:
            raise ValueError(
                f"record {i} has fields {describe(got)}, the first record {describe(specs)}; "
                "every record needs "
                "the same fields, shapes and dtypes (pad variable-length values to a fixed "
                "size first)."
            )
        rows.append(arrays)
        if len(rows) == shard_size:
            yield {k: np.stack([r[k] for r in rows]) for k in specs}
            rows = []
    if rows:
        assert specs is not None
        yield {k: np.stack([r[k] for r in rows]) for k in specs}


def _array_shards(
    arrays: Mapping[str, np.ndarray], shard_size: int
) -> Iterable[dict[str, np.ndarray]]:
    lengths = {k: len(a) for k, a in arrays.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(
            f"fields have different lengths {lengths}; every field needs one row per example."
        )
    n = next(iter(lengths.values()))
    for start in range(0, n, shard_size):
        yield {k: a[start : start + shard_size] for k, a in arrays.items()}


def write_source(
    path: str | os.PathLike[str],
    data: Mapping[str, np.ndarray] | Iterable[Mapping[str, Any]],
    *,
    shard_size: int = 65_536,
) -> dict[str, Any]:
    """Writes ``data`` in meshfeed's folder format under ``path`` (a folder or an fsspec URL).

    Args:
      path: the folder to create; it must not hold a dataset already.
      data: a mapping field -> array (equal lengths), or an iterable of records (dicts
        field -> value, all with the same fields, shapes and dtypes), written
        ``shard_size`` records at a time so it may be larger than memory.
      shard_size: examples per ``.npy`` shard.

    Returns:
      The manifest that was written.
    """
    root = os.fspath(path)
    if not isinstance(shard_size, int) or isinstance(shard_size, bool) or shard_size < 1:
        raise ValueError(f"shard_size={shard_size!r} must be an int >= 1.")
    writer = _Writer(root)
    if writer.exists(MANIFEST):
        raise FileExistsError(
            f"{_join(root, MANIFEST)} exists: {root} already holds a dataset; write to a "
            "new folder or delete it first."
        )
    if isinstance(data, Mapping):
        if not data:
            raise ValueError("data is an empty mapping; pass at least one field.")
        for name, array in data.items():
            if not isinstance(array, np.ndarray) or array.ndim == 0:
                raise TypeError(
                    f"field {name!r} is {type(array).__name__}; pass numpy arrays with a "
                    "leading example dimension."
                )
        shards = _array_shards(cast(Mapping[str, np.ndarray], data), shard_size)
    elif isinstance(data, Iterable) and not isinstance(data, str | bytes):
        shards = _records_to_shards(data, shard_size)
    else:
        raise TypeError(
            f"data is a {type(data).__name__}; pass a mapping field -> array or an "
            "iterable of dicts."
        )
    fields: dict[str, dict[str, Any]] = {}
    entries = []
    total = 0
    for index, shard in enumerate(shards):
        files = {}
        for name, array in shard.items():
            if array.dtype.hasobject:
                raise ValueError(
                    f"field {name!r} holds Python objects (dtype object); write_source stores "
                    "fixed-size rows only: pad or encode the values to a fixed shape."
                )
            spec = {"shape": list(array.shape[1:]), "dtype": array.dtype.str}
            if fields.setdefault(name, spec) != spec:
                raise ValueError(f"field {name!r} changed shape or dtype at shard {index}.")
            payload = _npy_bytes(array)
            relative = f"{name}/{index:05d}.npy"
            writer.write(relative, payload)
            files[name] = {
                "path": relative,
                "bytes": len(payload),
                "sha256": hashlib.sha256(payload).hexdigest(),
            }
        rows = len(next(iter(shard.values())))
        entries.append({"rows": rows, "files": files})
        total += rows
    if not total:
        raise ValueError("data has no examples; write at least one.")
    manifest = {"format": FORMAT, "num_examples": total, "fields": fields, "shards": entries}
    writer.write(MANIFEST, json.dumps(manifest, indent=1).encode())
    return manifest


class ShardedSource:
    """A ``Source`` over ``.npy`` shards (a meshfeed folder, or one ``.npy``/``.npz``).

    Rows are read by byte range from the shards that hold them. ``bytes_read`` counts
    the row bytes read so far (headers aside), to see that a process reads only its own.
    Built by ``meshfeed.open_source``.
    """

    def __init__(self, shards: list[dict[str, NpyRows]], *, name: str) -> None:
        self.name = name
        self._shards = shards
        first = shards[0]
        self._fields = {k: FieldSpec(r.row_shape, r.dtype) for k, r in first.items()}
        self._starts = np.cumsum([0] + [next(iter(s.values())).rows for s in shards])
        self._len = int(self._starts[-1])

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        return self._fields

    def __len__(self) -> int:
        return self._len

    @property
    def bytes_read(self) -> int:
        return sum(r.bytes_read for shard in self._shards for r in shard.values())

    def __getitem__(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        ids = check_ids(ids, self._len, self.name)
        shard, local = locate(self._starts, ids)
        return gather_by_part(shard, local, self._fields, self._read_shard)

    def _read_shard(self, shard: int, local: np.ndarray) -> dict[str, np.ndarray]:
        return {name: rows.read(local) for name, rows in self._shards[shard].items()}

    def __repr__(self) -> str:
        shards = len(self._shards)
        return (
            f"ShardedSource({self.name!r}, {self._len} examples in {shards} shards; "
            f"{fields_text(self._fields)})"
        )


def open_source(path: str | os.PathLike[str], *, verify: bool = False) -> ShardedSource:
    """Opens a meshfeed folder (one with ``meshfeed.json``), a ``.npy`` or a ``.npz``.

    Args:
      path: a local path or an fsspec URL (``file://``, ``memory://``, ``s3://``, ...).
      verify: also read every shard whole once and check its SHA-256 against the
        manifest (after copying a dataset, say). Headers and sizes are always checked.

    Returns:
      A ``ShardedSource`` reading only the rows asked for.
    """
    root = os.fspath(path)
    if root.endswith(".npy"):
        blob = Blob(root)
        rows = NpyRows(blob)
        rows.check_size()
        field = os.path.basename(root.rstrip("/")).removesuffix(".npy")
        return ShardedSource([{field: rows}], name=root)
    if root.endswith(".npz"):
        members = npz_members(Blob(root))
        if not members:
            raise ValueError(f"{root} holds no arrays.")
        for member in members.values():
            member.check_size()
        lengths = {k: m.rows for k, m in members.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"{root} holds arrays of different lengths {lengths}.")
        return ShardedSource([members], name=root)
    manifest_path = _join(root, MANIFEST)
    try:
        raw = Blob(manifest_path)
        text = raw.read(0, raw.size())
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{manifest_path} does not exist: {root} is not a meshfeed dataset (or its "
            "write did not finish). Write one with meshfeed.write_source, or open a "
            ".npy/.npz file."
        ) from None
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{manifest_path} is not valid JSON ({error}): corrupt?") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{manifest_path} is not a {FORMAT} manifest.")
    fields = manifest["fields"]
    shards: list[dict[str, NpyRows]] = []
    for entry in manifest["shards"]:
        shard = {}
        for name, spec in fields.items():
            info = entry["files"].get(name)
            if info is None:
                raise ValueError(f"{manifest_path} lists a shard without field {name!r}.")
            file_path = _join(root, info["path"])
            rows = NpyRows(Blob(file_path))
            want_dtype, want_shape = np.dtype(spec["dtype"]), tuple(spec["shape"])
            if rows.dtype != want_dtype or rows.row_shape != want_shape:
                raise ValueError(
                    f"{file_path} holds {field_text(FieldSpec(rows.row_shape, rows.dtype))} "
                    f"rows but the manifest says {field_text(FieldSpec(want_shape, want_dtype))}: "
                    f"shards of field "
                    f"{name!r} disagree; rewrite the dataset."
                )
            if rows.rows != entry["rows"]:
                raise ValueError(
                    f"{file_path} has {rows.rows} rows, the manifest says {entry['rows']}."
                )
            size = rows.blob.size()
            if size != info["bytes"]:
                raise ValueError(
                    f"{file_path} is {size} bytes, the manifest says {info['bytes']}: the "
                    "file is truncated or was replaced."
                )
            rows.check_size(size)
            if verify:
                digest = hashlib.sha256(rows.blob.read(0, size)).hexdigest()
                if digest != info["sha256"]:
                    raise ValueError(
                        f"{file_path} does not match its checksum in {manifest_path} "
                        f"(sha256 {digest[:12]}..., expected {info['sha256'][:12]}...): "
                        "the file is corrupt."
                    )
            shard[name] = rows
        shards.append(shard)
    if not shards:
        raise ValueError(f"{manifest_path} lists no shards.")
    return ShardedSource(shards, name=root)
