"""meshfeed's own folder format, read: ``open_source`` and ``ShardedSource``.

::

    data/
      meshfeed.json               # lengths, fields (shape, dtype), shards, checksums
      image/00000.npy             # rows 0 .. shard_size-1 of field "image"
      image/00001.npy
      tokens/00000.values.npy     # a ragged field: its documents' values, one after another
      tokens/00000.offsets.npy    # and where each document starts (N + 1 offsets)
      ...

Plain ``.npy`` files, so any tool reads them (``_writer`` writes them). ``open_source``
opens the folder -- or a folder of parts written by separate workers, or a single
``.npy``/``.npz`` -- as one ``Source`` over all shards and reads each step's rows by
byte range (``pread`` locally, ``cat_ranges`` through fsspec for URLs), so a process
reads its own rows and nothing else, and never downloads a shard whole. On open, every
shard's header and size are checked against the manifest (dtype, shape, truncation);
``verify=True`` also checks every byte against the manifest's SHA-256.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from meshfeed.data._files import NpyRows, RaggedRows, npz_members
from meshfeed.data._folder import FORMAT, MANIFEST, check_prepared, join, part_folder
from meshfeed.data._sources import (
    FieldSpec,
    check_ids,
    field_text,
    fields_text,
    gather_by_part,
    locate,
)
from meshfeed.data._tokenizer import TokenizerArg
from meshfeed.storage._blob import Blob, is_url, require_fsspec
from meshfeed.storage._cache import CACHE_BYTES, ShardCache
from meshfeed.storage._remote import RETRY_S, merge, remote_pool

_PART = re.compile(r"part-(\d{5})-of-(\d{5})$")
Rows = NpyRows | RaggedRows


class ShardedSource:
    """A ``Source`` over ``.npy`` shards (a meshfeed folder, or one ``.npy``/``.npz``).

    Rows are read by byte range from the shards that hold them. ``bytes_read`` counts
    the row bytes read so far (headers aside), to see that a process reads only its own;
    behind a URL, ``requests`` and ``bytes_fetched`` count what crossed the network
    (rows less than 64 KiB apart in a file are fetched as one request).
    Behind a URL, the reads of every shard and field a batch touches are in flight
    together.
    ``lengths(field)`` gives a ragged field's document lengths from its offsets. Built by
    ``meshfeed.open_source``.
    """

    def __init__(self, shards: list[dict[str, Rows]], *, name: str) -> None:
        self.name = name
        self._shards = shards
        first = shards[0]
        self._fields = {k: FieldSpec(r.row_shape, r.dtype) for k, r in first.items()}
        self._starts = np.cumsum([0] + [next(iter(s.values())).rows for s in shards])
        self._len = int(self._starts[-1])
        self._remote = is_url(name)

    @property
    def remote(self) -> bool:
        """Whether the shards are behind a URL."""
        return self._remote

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        """Each field's shape and dtype (per example), by name."""
        return self._fields

    def __len__(self) -> int:
        """The number of examples."""
        return self._len

    @property
    def bytes_read(self) -> int:
        """Bytes read from the shards so far, by every read of this source."""
        return sum(r.bytes_read for shard in self._shards for r in shard.values())

    @property
    def requests(self) -> int:
        """Requests sent to the store behind a URL so far (0 for local files)."""
        return sum(b.fetched.requests for s in self._shards for r in s.values() for b in r.blobs)

    @property
    def bytes_fetched(self) -> int:
        """Bytes received from the store behind a URL so far, gaps between rows included."""
        return sum(b.fetched.bytes for s in self._shards for r in s.values() for b in r.blobs)

    def fetches(self, ids: np.ndarray) -> tuple[int, int]:
        """The requests and bytes reading ``ids`` asks a store for, cache aside (nothing
        is read but a ragged field's offsets, once)."""
        ids = check_ids(ids, self._len, self.name)
        shard, local = locate(self._starts, ids)
        requests = fetched = 0
        for p in np.unique(shard).tolist():
            for rows in self._shards[p].values():
                starts, ends = rows.byte_ranges(local[shard == p])
                merged = merge(starts.tolist(), ends.tolist())
                requests += len(merged)
                fetched += sum(hi - lo for lo, hi, _ in merged)
        return requests, fetched

    def __getitem__(self, ids: np.ndarray) -> dict[str, Any]:
        """The examples ``ids`` (a 1-D int array): one array per field, a row per id."""
        ids = check_ids(ids, self._len, self.name)
        shard, local = locate(self._starts, ids)
        parts = np.unique(shard).tolist()
        if not self._remote or all(
            b.local_copy for p in parts for r in self._shards[p].values() for b in r.blobs
        ):  # local files, or local copies (cache_dir) of every file this read touches
            return gather_by_part(shard, local, self._fields, self._read_shard)
        # Behind a URL every read waits on the network: put the reads of every shard and
        # field in flight together (each one all its byte ranges, through cat_ranges).
        pool = remote_pool()
        reads = {
            p: {
                name: pool.submit(rows.read, local[shard == p])
                for name, rows in self._shards[p].items()
            }
            for p in parts
        }
        return gather_by_part(
            shard, local, self._fields, lambda p, _: {k: f.result() for k, f in reads[p].items()}
        )

    def _read_shard(self, shard: int, local: np.ndarray) -> dict[str, Any]:
        return {name: rows.read(local) for name, rows in self._shards[shard].items()}

    def lengths(self, field: str) -> np.ndarray:
        """Every document's length in the ragged ``field`` (read from its offsets)."""
        if field not in self._fields or not self._fields[field].ragged:
            ragged = [k for k, s in self._fields.items() if s.ragged]
            raise ValueError(
                f"lengths({field!r}): that is not a ragged field of {self.name}; its ragged "
                f"fields are {ragged}."
            )
        return np.concatenate([shard[field].lengths() for shard in self._shards])  # type: ignore[union-attr]

    def __repr__(self) -> str:
        shards = len(self._shards)
        return (
            f"ShardedSource({self.name!r}, {self._len} examples in {shards} shards; "
            f"{fields_text(self._fields)})"
        )


def open_source(
    path: str | os.PathLike[str],
    *,
    verify: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    retry_s: float = RETRY_S,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_bytes: int = CACHE_BYTES,
    tokenizer: TokenizerArg | None = None,
) -> ShardedSource:
    """Opens a meshfeed folder (one with ``meshfeed.json``, or one of parts), a ``.npy``
    or a ``.npz``.

    Args:
      path: a local path or an fsspec URL (``file://``, ``memory://``, ``s3://``, ...).
      verify: also read every shard whole once and check its SHA-256 against the
        manifest (after copying a dataset, say). Headers and sizes are always checked.
      storage_options: for a URL, the filesystem's options (``endpoint_url``, ``key``,
        ``secret``, ``anon``, ...), as fsspec, pandas and Hugging Face datasets take them.
      retry_s: for a URL, how long the store may fail or be unreachable with no
        success in between before every read of it raises (one clock per store and
        process, shared by every read; the reads wait with backoff meanwhile); a
        missing object or denied access raises at once.
      cache_dir: for a URL, a local directory to keep whole shard files in once read,
        so later epochs read the disk instead of the store (``None``: no cache; every
        read is a range request). Processes on one machine may share it.
      cache_bytes: the most bytes ``cache_dir`` holds (16 GiB by default); the least
        recently used files are deleted to make room, and a file larger than this is
        read by range instead.
      tokenizer: for a folder made by ``meshfeed.prepare``, the tokenizer the reader
        will use (a ``tokenizers.Tokenizer``, a ``tokenizer.json`` path or a
        ``TokenizerFunction``): its content hash, fingerprint, vocabulary and special
        tokens are compared with the folder's record, and a mismatch is refused, naming
        what differs. A prepared folder whose build is unfinished is always refused.

    Returns:
      A ``ShardedSource`` reading only the rows asked for.
    """
    root = os.fspath(path)
    cache = None
    if cache_dir is not None:
        if not is_url(root):
            raise ValueError(
                f"cache_dir keeps copies of files behind a URL, but {root} is a local path "
                "already; drop cache_dir."
            )
        cache = ShardCache(cache_dir, cache_bytes)
    blob = functools.partial(Blob, storage_options=storage_options, retry_s=retry_s, cache=cache)
    if root.endswith(".npy"):
        rows = NpyRows(blob(root))
        rows.check_size()
        field = os.path.basename(root.rstrip("/")).removesuffix(".npy")
        return ShardedSource([{field: rows}], name=root)
    if root.endswith(".npz"):
        members = npz_members(blob(root))
        if not members:
            raise ValueError(f"{root} holds no arrays.")
        for member in members.values():
            member.check_size()
        lengths = {k: m.rows for k, m in members.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"{root} holds arrays of different lengths {lengths}.")
        return ShardedSource(list([members]), name=root)  # type: ignore[list-item]
    check_prepared(root, tokenizer=tokenizer, storage_options=storage_options)
    parts = _parts(root, storage_options)
    if parts:
        shards: list[dict[str, Rows]] = []
        fields: Any = None
        for folder in parts:
            manifest = _manifest(join(root, folder), blob)
            if not manifest["num_examples"]:
                continue  # a part of a build that kept no documents
            if fields is not None and manifest["fields"] != fields:
                raise ValueError(
                    f"{join(root, folder)} has fields {manifest['fields']}, {parts[0]} has "
                    f"{fields}: the parts were written from different data."
                )
            fields = manifest["fields"]
            shards += _shards(join(root, folder), manifest, blob, verify=verify)
        if not shards:
            raise ValueError(f"{root} holds {len(parts)} parts and no examples in any of them.")
        return ShardedSource(shards, name=root)
    manifest = _manifest(root, blob)
    if not manifest["shards"]:
        raise ValueError(f"{join(root, MANIFEST)} lists no examples.")
    return ShardedSource(_shards(root, manifest, blob, verify=verify), name=root)


def _parts(root: str, storage_options: Mapping[str, Any] | None) -> list[str]:
    """The part folders under ``root`` in order, when it holds parts and no manifest."""
    if is_url(root):
        fs, inner = require_fsspec().core.url_to_fs(root, **dict(storage_options or {}))
        if fs.exists(f"{inner.rstrip('/')}/{MANIFEST}") or not fs.isdir(inner):
            return []
        names = [p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(inner, detail=False)]
    else:
        if os.path.exists(os.path.join(root, MANIFEST)) or not os.path.isdir(root):
            return []
        names = os.listdir(root)
    found = {int(m.group(1)): int(m.group(2)) for n in names if (m := _PART.match(n))}
    if not found:
        return []
    counts = set(found.values())
    if len(counts) > 1:
        raise ValueError(f"{root} holds parts of different counts {sorted(counts)}; keep one set.")
    count = counts.pop()
    missing = [i for i in range(count) if i not in found]
    if missing:
        raise FileNotFoundError(
            f"{root} holds {len(found)} of {count} parts; parts {missing} are missing (their "
            "writers have not finished, or failed): write them, then open the dataset."
        )
    return [part_folder(i, count) for i in range(count)]


def _manifest(root: str, blob: Callable[[str], Blob]) -> dict[str, Any]:
    manifest_path = join(root, MANIFEST)
    try:
        raw = blob(manifest_path)
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
    if not manifest["shards"] and manifest.get("num_examples") != 0:
        raise ValueError(f"{manifest_path} lists no shards.")
    return manifest


def _checked(
    root: str, info: dict[str, Any], rows: int, blob: Callable[[str], Blob], *, verify: bool
) -> NpyRows:
    """One ``.npy`` of a shard, checked against its manifest entry."""
    file_path = join(root, info["path"])
    npy = NpyRows(blob(file_path))
    npy.blob.version = info["sha256"]  # a rewritten file is not read from an old copy
    if npy.rows != rows:
        raise ValueError(f"{file_path} has {npy.rows} rows, the manifest says {rows}.")
    size = npy.blob.size()
    if size != info["bytes"]:
        raise ValueError(
            f"{file_path} is {size} bytes, the manifest says {info['bytes']}: the file is "
            "truncated or was replaced."
        )
    npy.check_size(size)
    if verify:
        digest = hashlib.sha256(npy.blob.read(0, size)).hexdigest()
        if digest != info["sha256"]:
            raise ValueError(
                f"{file_path} does not match its checksum in {join(root, MANIFEST)} "
                f"(sha256 {digest[:12]}..., expected {info['sha256'][:12]}...): the file "
                "is corrupt."
            )
    return npy


def _shards(
    root: str, manifest: dict[str, Any], blob: Callable[[str], Blob], *, verify: bool
) -> list[dict[str, Rows]]:
    shards: list[dict[str, Rows]] = []
    for entry in manifest["shards"]:
        shard: dict[str, Rows] = {}
        for name, spec in manifest["fields"].items():
            info = entry["files"].get(name)
            if info is None:
                raise ValueError(f"{join(root, MANIFEST)} lists a shard without field {name!r}.")
            want = FieldSpec(tuple(spec["shape"]), np.dtype(spec["dtype"]))
            if want.ragged:
                values = NpyRows(blob(join(root, info["values"]["path"])))
                rows: Rows = RaggedRows(
                    _checked(root, info["values"], values.rows, blob, verify=verify),
                    _checked(root, info["offsets"], entry["rows"] + 1, blob, verify=verify),
                )
            else:
                rows = _checked(root, info, entry["rows"], blob, verify=verify)
            got = FieldSpec(rows.row_shape, rows.dtype)
            if got != want:
                raise ValueError(
                    f"{rows.name} holds {field_text(got)} rows but the manifest says "
                    f"{field_text(want)}: shards of field {name!r} disagree; rewrite the dataset."
                )
            shard[name] = rows
        shards.append(shard)
    return shards
