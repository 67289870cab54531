"""The index of a streaming file: where each sample lies, and which file it was made from.

A file made to be read front to back -- a tar shard, JSON Lines, TFRecord -- becomes
random-access with its *index*: a small sidecar, ``<file>.meshfeed-index.npz`` beside the
file (or in an ``index_dir`` of the user's choosing, named by the file's path, when the
data's location is read-only). It is an uncompressed ``.npz`` -- plain numpy, any tool
reads it -- holding the byte offset and size of every sample (per member, for a tar
shard), and a ``meta`` record: the format, the file's size and its modification time
(an object's ETag behind a URL), and what the scan learned (a tar shard's extensions,
a compressed file's members). A source checks every index against its file when it
opens it, and refuses one whose file changed since, by name, with the command that
rebuilds it.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import io
import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from meshfeed.data._folder import join
from meshfeed.data._writer import FolderWriter
from meshfeed.storage._blob import Blob, is_url, require_fsspec
from meshfeed.storage._paths import kind_by_suffix

READ = 2 << 20
"""Bytes a scan reads at a time from a local file (small: the first read of a file waits,
the later ones overlap the parsing)."""
READ_REMOTE = 8 << 20
"""Bytes a scan reads at a time behind a URL (one range request each)."""
INDEX_SUFFIX = ".meshfeed-index.npz"
INDEX_FORMAT = "meshfeed.index/1"
KINDS = {
    ".tar": "tar",
    ".jsonl": "jsonl",
    ".jsonl.gz": "jsonl",
    ".jsonl.zst": "jsonl",
    ".tfrecord": "tfrecord",
    ".tfrecords": "tfrecord",
    ".tfrec": "tfrecord",
}
"""File suffix -> the format it is indexed as."""


class Index:
    """One file's index: ``meta`` (a JSON-able dict) and its arrays, by name."""

    def __init__(self, meta: dict[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        self.meta, self.arrays = meta, dict(arrays)

    @property
    def samples(self) -> int:
        """How many samples the file holds."""
        return int(self.meta["samples"])

    def to_bytes(self) -> bytes:
        buffer = io.BytesIO()
        meta = np.frombuffer(json.dumps(self.meta).encode(), np.uint8)
        np.savez(buffer, meta=meta, **self.arrays)  # type: ignore[arg-type]
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, name: str) -> Index:
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}
            meta = json.loads(arrays.pop("meta").tobytes())
        except Exception as error:
            raise ValueError(f"{name} is not a meshfeed index ({error}); build it again.") from None
        if meta.get("format") != INDEX_FORMAT:
            raise ValueError(f"{name} is not a {INDEX_FORMAT} index; build it again.")
        return cls(meta, arrays)


def kind_of(path: str) -> str | None:
    """The format a file is indexed as, by its suffix."""
    return kind_by_suffix(path, KINDS)


def index_path(path: str, index_dir: str | None) -> str:
    """Where the index of ``path`` lives: beside it, or in ``index_dir``."""
    if index_dir is None:
        return path + INDEX_SUFFIX
    digest = hashlib.sha1(path.encode()).hexdigest()[:12]
    return join(index_dir, f"{path.rstrip('/').rsplit('/', 1)[-1]}.{digest}{INDEX_SUFFIX}")


def stamp(path: str, storage_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """What tells a file's version: its size and modification time (local), or its size
    and ETag (or modification time) behind a URL."""
    if not is_url(path):
        info = os.stat(path)
        return {"size": info.st_size, "mtime_ns": info.st_mtime_ns}
    fs, inner = require_fsspec().core.url_to_fs(path, **dict(storage_options or {}))
    info = fs.info(inner)
    out: dict[str, Any] = {"size": int(info["size"])}
    for key in ("ETag", "etag", "md5Hash", "LastModified", "mtime", "last_modified"):
        if info.get(key) is not None:
            out[key.lower()] = str(info[key])
            break
    return out


def changed(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> str | None:
    """How a file differs from when it was indexed (``None``: it does not)."""
    for key, value in current.items():
        if key in recorded and recorded[key] != value:
            return f"its {key} is {value} now, {recorded[key]} when it was indexed"
    return None


def load_index(
    path: str, index_dir: str | None, storage_options: Mapping[str, Any] | None
) -> Index | None:
    """The index of ``path``, or ``None`` where it has none yet."""
    target = index_path(path, index_dir)
    try:
        blob = Blob(target, storage_options)
        data = blob.read(0, blob.size())
    except FileNotFoundError:
        return None
    return Index.from_bytes(data, target)


def save_index(
    path: str, index: Index, index_dir: str | None, storage_options: Mapping[str, Any] | None
) -> str:
    """Writes the index of ``path`` (whole or not at all); returns where."""
    target = index_path(path, index_dir)
    folder, name = target.rsplit("/", 1) if (is_url(target) or "/" in target) else (".", target)
    if not is_url(folder):
        os.makedirs(folder, exist_ok=True)
    FolderWriter(folder, storage_options).write(name, index.to_bytes())
    return target


class ReadAhead:
    """A file read in chunks for a scan, the next chunk fetched on a thread while this one
    is parsed: a cold read and the parsing overlap instead of taking turns."""

    def __init__(self, blob: Blob, depth: int = 3) -> None:
        self.blob, self.size, self.depth = blob, blob.size(), depth
        self.chunk = READ_REMOTE if is_url(blob.path) else READ
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="meshfeed-scan")
        self._ahead: list[tuple[int, int, concurrent.futures.Future[bytes]]] = []  # in order

    def read(self, start: int, count: int) -> bytes:
        """At least ``count`` bytes from ``start`` (fewer at the end of the file), and
        usually a chunk; the next ``depth`` chunks are read meanwhile."""
        while self._ahead and self._ahead[0][1] <= start:  # chunks the scan has passed
            self._ahead.pop(0)
        data = None
        if self._ahead and self._ahead[0][0] <= start:
            ahead_start, ahead_end, future = self._ahead.pop(0)
            ahead = future.result()
            if ahead_end - start >= min(count, self.size - start):
                data = ahead[start - ahead_start :] if start > ahead_start else ahead
        if data is None:
            self._ahead.clear()  # a jump past them: start again from here
            data = self.blob.read(start, min(self.size, start + max(count, self.chunk)))
        after = self._ahead[-1][1] if self._ahead else start + len(data)
        while len(self._ahead) < self.depth and after < self.size:
            end = min(self.size, after + self.chunk)
            self._ahead.append((after, end, self._pool.submit(self.blob.read, after, end)))
            after = end
        return data

    def chunks(self) -> Any:
        """The whole file, chunk after chunk."""
        at = 0
        while at < self.size:
            data = self.read(at, 1)
            yield data
            at += len(data)

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
