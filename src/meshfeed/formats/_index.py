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

import hashlib
import io
import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from meshfeed.data._blob import Blob, is_url, require_fsspec
from meshfeed.data._folder import join
from meshfeed.data._writer import FolderWriter

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
    name = path.rsplit("/", 1)[-1].lower()
    for suffix in sorted(KINDS, key=len, reverse=True):
        if name.endswith(suffix):
            return KINDS[suffix]
    return None


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
