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

from meshfeed.core._npy import load_npz
from meshfeed.data._folder import join
from meshfeed.data._writer import FolderWriter
from meshfeed.storage._blob import Blob, is_url
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
    ".tgz": "tar",
    ".tar.gz": "tar",
    ".tar.zst": "tar",
    ".jsonl": "jsonl",
    ".jsonl.gz": "jsonl",
    ".jsonl.zst": "jsonl",
    ".tfrecord": "tfrecord",
    ".tfrecords": "tfrecord",
    ".tfrec": "tfrecord",
    ".tfrecord.gz": "tfrecord",
    ".tfrecords.gz": "tfrecord",
}
"""File suffix -> the format it is indexed as."""


class Index:
    """One file's index: ``meta`` (a JSON-able dict) and its arrays, by name."""

    def __init__(self, meta: dict[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        self.meta = meta
        self.arrays = dict(arrays)

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
            arrays = load_npz(data)
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


def load_index(
    path: str, index_dir: str | None, storage_options: Mapping[str, Any] | None
) -> Index | None:
    """The index of ``path``, or ``None`` where it has none yet."""
    target = index_path(path, index_dir)
    try:
        data = Blob(target, storage_options).read_all()  # one request: no size asked first
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
    is parsed: a cold read and the parsing overlap instead of taking turns. The chunk read
    last is held, so a read inside it costs nothing, and one across its end is joined to
    the next chunk rather than starting the reads again from there; ``read_in`` gives a
    chunk as it came, with an offset, where a copy of its rest would copy the whole file
    once more."""

    def __init__(self, blob: Blob, depth: int = 3) -> None:
        self.blob = blob
        self.size = blob.size()
        self.depth = depth
        self.chunk = READ_REMOTE if is_url(blob.path) else READ
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="meshfeed-scan")
        self._ahead: list[tuple[int, int, concurrent.futures.Future[bytes]]] = []  # in order
        self._held: tuple[int, bytes] = (0, b"")  # the chunk read last, and where it starts

    def read(self, start: int, count: int) -> bytes:
        """At least ``count`` bytes from ``start`` (fewer at the end of the file), and
        usually a chunk; the next ``depth`` chunks are read meanwhile."""
        data, skip = self.read_in(start, count)
        return data[skip:] if skip else data

    def read_in(self, start: int, count: int) -> tuple[bytes, int]:
        """``read`` without copying: a chunk, and where ``start`` lies in it."""
        want = min(count, self.size - start)
        base, data = self._held
        if not (base <= start and base + len(data) - start >= want):
            base, data = self._held = self._fetch(start, want)
        self._queue(base + len(data))
        return data, start - base

    def _queue(self, after: int) -> None:
        """Keeps ``depth`` chunks in flight: after the last one queued, or from ``after``."""
        after = self._ahead[-1][1] if self._ahead else after
        while len(self._ahead) < self.depth and after < self.size:
            end = min(self.size, after + self.chunk)
            self._ahead.append((after, end, self._pool.submit(self.blob.read, after, end)))
            after = end

    def _fetch(self, start: int, want: int) -> tuple[int, bytes]:
        """The chunk that holds ``want`` bytes from ``start``, and where it starts."""
        while self._ahead and self._ahead[0][1] <= start:  # chunks the scan has passed
            self._ahead.pop(0)
        held_start, held = self._held
        if self._ahead and self._ahead[0][0] <= start:
            ahead_start, ahead_end, future = self._ahead.pop(0)
            if ahead_end - start >= want:
                return ahead_start, future.result()
        elif self._ahead and self._ahead[0][0] == held_start + len(held) > start >= held_start:
            _, ahead_end, future = self._ahead.pop(0)  # across the end of the chunk held
            if ahead_end - start >= want:
                return start, held[start - held_start :] + future.result()
        self._ahead.clear()  # a jump past them: start again from here
        return start, self.blob.read(start, min(self.size, start + max(want, self.chunk)))

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
