"""What every source over indexed files shares: the files, their indexes, byte-range reads.

``IndexedFiles`` opens a list of files (paths, globs, brace patterns or URLs), loads each
one's index -- building a missing one when asked, refusing a file changed since it was
indexed -- and numbers the samples of all files one after another. A read of some ids
becomes, per file, a list of byte ranges read in one call (``pread`` locally; behind a
URL the coalesced, concurrent, retried range requests and the optional cache of
``open_source``), the reads of several files in flight together. The format modules say
which ranges a sample needs and what its bytes mean.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from meshfeed.data._sources import check_ids, locate
from meshfeed.formats._index import Index, changed, kind_of, load_index, stamp
from meshfeed.storage._blob import Blob, is_url
from meshfeed.storage._cache import CACHE_BYTES, ShardCache
from meshfeed.storage._paths import expand_paths
from meshfeed.storage._remote import merge, remote_pool

Scan = Callable[[Blob], Index]


class IndexedFiles:
    """Files of one format, their indexes, and their samples numbered in file order."""

    def __init__(
        self,
        files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        kind: str,
        scan: Scan,
        index_dir: str | os.PathLike[str] | None,
        build: bool,
        storage_options: Mapping[str, Any] | None,
        retry_s: float,
        cache_dir: str | os.PathLike[str] | None,
        cache_bytes: int = CACHE_BYTES,
    ) -> None:
        self.paths = expand_paths(files, storage_options, what="files")
        wrong = [p for p in self.paths if kind_of(p) != kind]
        if wrong:
            raise ValueError(
                f"{wrong[0]} is not a {kind} file (by its suffix); pass {kind} files only."
            )
        cache = None
        if cache_dir is not None:
            if not all(is_url(p) for p in self.paths):
                raise ValueError(
                    "cache_dir keeps copies of files behind URLs; drop it for local files."
                )
            cache = ShardCache(os.fspath(cache_dir), cache_bytes)
        self.index_dir = None if index_dir is None else os.fspath(index_dir)
        self.storage_options = storage_options
        blob = functools.partial(
            Blob, storage_options=storage_options, retry_s=retry_s, cache=cache
        )
        self.blobs = [blob(p) for p in self.paths]
        self.indexes = [self._index(b, scan, build) for b in self.blobs]
        self.starts = np.cumsum([0] + [ix.samples for ix in self.indexes])
        self.name = (
            self.paths[0]
            if len(self.paths) == 1
            else f"{self.paths[0]} and {len(self.paths) - 1} more"
        )
        self.remote = is_url(self.paths[0])

    def _index(self, blob: Blob, scan: Scan, build: bool) -> Index:
        path = blob.path
        current = stamp(path, self.storage_options)
        found = load_index(path, self.index_dir, self.storage_options)
        if found is not None:
            how = changed(found.meta["file"], current)
            if how is None:
                return found
            if not build:
                raise ValueError(
                    f"{path} changed since it was indexed ({how}); index it again: "
                    f"meshfeed.index({path!r}) or `meshfeed index {path}`, or pass build=True."
                )
        elif not build:
            raise FileNotFoundError(
                f"{path} has no index yet; build the indexes once with meshfeed.index(files) "
                f"(`meshfeed index FILES...`, several processes at once), or pass build=True "
                "to build missing ones here."
            )
        from meshfeed.formats._index import save_index  # only when building

        index = scan(blob)
        index.meta["file"] = current
        save_index(path, index, self.index_dir, self.storage_options)
        return index

    def __len__(self) -> int:
        return int(self.starts[-1])

    def locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(file, sample within the file)`` of each id (checked)."""
        ids = check_ids(ids, len(self), self.name)
        return locate(self.starts, ids)

    def read(self, ranges: Mapping[int, tuple[np.ndarray, np.ndarray]]) -> dict[int, list[bytes]]:
        """For each file, the bytes of its ``(starts, ends)`` ranges; behind a URL, the
        files' reads in flight together."""

        def one(f: int) -> list[bytes]:
            starts, ends = ranges[f]
            return read_ranges(self.blobs[f], starts, ends)

        if not self.remote or len(ranges) == 1:
            return {f: one(f) for f in ranges}
        futures = {f: remote_pool().submit(one, f) for f in ranges}
        return {f: future.result() for f, future in futures.items()}

    def fetches(self, ranges: Mapping[int, tuple[np.ndarray, np.ndarray]]) -> tuple[int, int]:
        """The requests and bytes those reads ask a store for (ranges close together
        are one request)."""
        requests = fetched = 0
        for starts, ends in ranges.values():
            merged = merge(starts.tolist(), ends.tolist())
            requests += len(merged)
            fetched += sum(hi - lo for lo, hi, _ in merged)
        return requests, fetched

    @property
    def requests(self) -> int:
        """Range requests sent to the store behind a URL so far."""
        return sum(b.fetched.requests for b in self.blobs)

    @property
    def bytes_fetched(self) -> int:
        """Bytes received from the store behind a URL so far."""
        return sum(b.fetched.bytes for b in self.blobs)

    def fingerprint(self) -> list[list[Any]]:
        """What the samples depend on: each file's name, size and samples, in order (not
        the folder: a state restores where the same files sit at another path)."""
        return [
            [p.rstrip("/").rsplit("/", 1)[-1], ix.meta["file"]["size"], ix.samples]
            for p, ix in zip(self.paths, self.indexes, strict=True)
        ]


class FilesSource:
    """What every source over ``IndexedFiles`` shares: its length, and what its files
    say about the store behind them (for ``loader.plan`` and the object storage guide)."""

    if TYPE_CHECKING:  # set by each source's __init__
        files: IndexedFiles

    def __len__(self) -> int:
        """The number of samples, over every file."""
        return len(self.files)

    @property
    def remote(self) -> bool:
        """Whether the files are behind a URL."""
        return self.files.remote

    @property
    def name(self) -> str:
        """The files, for messages."""
        return self.files.name

    @property
    def requests(self) -> int:
        """Range requests sent to the store so far."""
        return self.files.requests

    @property
    def bytes_fetched(self) -> int:
        """Bytes received from the store so far."""
        return self.files.bytes_fetched


def read_ranges(blob: Blob, starts: np.ndarray, ends: np.ndarray) -> list[bytes]:
    """Bytes ``[starts[i], ends[i])`` of ``blob``, for every ``i``, in one read."""
    sizes = (ends - starts).astype(np.int64)
    buffer = bytearray(int(sizes.sum()))
    view = memoryview(buffer)
    at = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    views = [view[at[i] : at[i + 1]] for i in range(len(sizes))]
    some = [i for i in range(len(views)) if sizes[i]]  # an empty member needs no read
    blob.read_into([views[i] for i in some], [int(starts[i]) for i in some])
    return [bytes(v) for v in views]
