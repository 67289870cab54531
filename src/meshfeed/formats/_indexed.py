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

from meshfeed.core._lru import SizedLRU
from meshfeed.data._catalog import catalog_dir, changed, quoted, read_catalog, stamp
from meshfeed.data._sources import check_ids, locate
from meshfeed.data._store import no_catalog
from meshfeed.formats._index import KINDS, Index, kind_of, load_index
from meshfeed.formats._members import MemberReads
from meshfeed.storage._blob import Blob, is_url
from meshfeed.storage._cache import CACHE_BYTES, ShardCache
from meshfeed.storage._expect import ChangedError
from meshfeed.storage._file_errors import named
from meshfeed.storage._handles import limit_open_files
from meshfeed.storage._paths import expand_paths
from meshfeed.storage._remote import merge, remote_pool

Scan = Callable[[Blob], Index]
INDEX_BYTES = 256 << 20
"""Bytes of loaded indexes a source keeps, by default (``index_bytes``)."""


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
        hedge: bool = True,
        cache_bytes: int = CACHE_BYTES,
        index_bytes: int = INDEX_BYTES,
        max_open_files: int | None = None,
    ) -> None:
        limit_open_files(max_open_files)
        if not isinstance(index_bytes, int) or isinstance(index_bytes, bool) or index_bytes < 0:
            raise ValueError(f"index_bytes={index_bytes!r} must be an int >= 0 (bytes).")
        patterns = [os.fspath(files)] if isinstance(files, str | os.PathLike) else list(files)
        self.index_dir = None if index_dir is None else os.fspath(index_dir)
        self.storage_options = storage_options
        self._loaded = SizedLRU(index_bytes, _index_size)  # loaded indexes, by file
        found = None
        if not build and patterns and all(isinstance(p, str | os.PathLike) for p in patterns):
            found = read_catalog(
                [os.fspath(p) for p in patterns],
                kind=kind,
                index_dir=self.index_dir,
                storage_options=storage_options,
            )
        if found is not None:  # one request: every file's stamp and samples
            self.paths = [e["path"] for e in found[1]]
            self.metas = [e["meta"] for e in found[1]]
        else:
            self.paths = expand_paths(files, storage_options, what="files")
        wrong = [p for p in self.paths if kind_of(p) != kind]
        if wrong:
            suffixes = ", ".join(s for s, k in KINDS.items() if k == kind)
            raise ValueError(
                f"{wrong[0]} is not a {kind} file (by its suffix: {suffixes}); pass {kind} "
                "files only."
            )
        cache = None
        if cache_dir is not None:
            if not all(is_url(p) for p in self.paths):
                raise ValueError(
                    "cache_dir keeps copies of files behind URLs; drop it for local files."
                )
            cache = ShardCache(os.fspath(cache_dir), cache_bytes)
        blob = functools.partial(
            Blob, storage_options=storage_options, retry_s=retry_s, cache=cache, hedge=hedge
        )
        self.blobs = [blob(p) for p in self.paths]
        if found is None:  # every index read now (and kept, within index_bytes)
            if not build:
                where = catalog_dir([os.fspath(p) for p in patterns], self.index_dir)
                no_catalog(where, f"{len(self.paths)} {kind} files", quoted(patterns))
            indexes = [self._index(b, scan, build) for b in self.blobs]
            self.metas = [ix.meta for ix in indexes]
            for f, ix in enumerate(indexes):
                self._loaded.put(f, ix)
        else:
            for b, meta in zip(self.blobs, self.metas, strict=True):
                recorded = meta["file"]
                if is_url(b.path):  # the first read's reply: its size and ETag
                    b.expect(int(recorded["size"]), etag=recorded.get("etag"))
                else:  # a stat: its size and modification time, as when it was indexed
                    b.expect(None, check=functools.partial(_unchanged, recorded))
        self.starts = np.cumsum([0] + [int(m["samples"]) for m in self.metas])
        self.name = (
            self.paths[0]
            if len(self.paths) == 1
            else f"{self.paths[0]} and {len(self.paths) - 1} more"
        )
        self.remote = is_url(self.paths[0])

    def index(self, f: int) -> Index:
        """File ``f``'s index: read at its first use (and checked against the catalog),
        kept while the loaded indexes fit in ``index_bytes``, least recently used
        dropped first."""
        found = self._loaded.get(f)
        if found is not None:
            return found
        path = self.paths[f]
        found = load_index(path, self.index_dir, self.storage_options)
        if found is None:
            raise FileNotFoundError(
                f"{path} has no index (its catalog lists it): build it again with "
                f"meshfeed.index({path!r}) or `meshfeed index {path}`."
            )
        how = changed(self.metas[f]["file"], found.meta["file"])
        if how is not None:
            raise ChangedError(
                f"{path} was indexed again since its catalog was written ({how}); write the "
                f"catalog again: `meshfeed index` over the files."
            )
        self._loaded.put(f, found)
        return found

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

        with named(path, "indexing it"):
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

    def read_spans(
        self, ranges: Mapping[int, tuple[np.ndarray, np.ndarray]]
    ) -> dict[int, list[bytes]]:
        """``read`` of the ranges of each file's data: a compressed file's (its index
        holds ``members``) are of its decompressed stream, read as the members that hold
        them, and decompressed (``_members``)."""
        plans = _member_reads(self, ranges)
        data = self.read(_compressed(ranges, plans))
        for f, plan in plans.items():
            data[f] = plan.cut(self.index(f).meta["compression"], data[f], self.paths[f])
        return data

    def span_fetches(self, ranges: Mapping[int, tuple[np.ndarray, np.ndarray]]) -> tuple[int, int]:
        """``fetches`` of what ``read_spans(ranges)`` reads."""
        return self.fetches(_compressed(ranges, _member_reads(self, ranges)))

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
            [p.rstrip("/").rsplit("/", 1)[-1], m["file"]["size"], int(m["samples"])]
            for p, m in zip(self.paths, self.metas, strict=True)
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

    def origin(self, index: int) -> str:
        """Where example ``index`` is, for messages: ``<file>, <its place there>``."""
        file, local = self.files.locate(np.asarray([index]))
        return f"{self.files.paths[int(file[0])]}, {self.place(int(file[0]), int(local[0]))}"

    def place(self, f: int, row: int) -> str:
        """Where sample ``row`` of file ``f`` is in it (each format says it its way)."""
        return f"sample {row}"

    @property
    def requests(self) -> int:
        """Range requests sent to the store so far."""
        return self.files.requests

    @property
    def bytes_fetched(self) -> int:
        """Bytes received from the store so far."""
        return self.files.bytes_fetched


def _unchanged(recorded: Mapping[str, Any], blob: Blob) -> None:
    """A local file's first read: refused if its stamp is not the catalog's."""
    how = changed(recorded, stamp(blob.path, None))
    if how is not None:
        raise ChangedError(
            f"{blob.path} changed since it was indexed ({how}); index it again: "
            f"meshfeed.index({blob.path!r}) or `meshfeed index {blob.path}` (over all the "
            "files, for their catalog)."
        )


def _member_reads(
    files: IndexedFiles, ranges: Mapping[int, tuple[np.ndarray, np.ndarray]]
) -> dict[int, MemberReads]:
    """The reads of the ranges of ``files``' compressed files, by file."""
    out = {}
    for f, (starts, ends) in ranges.items():
        arrays = files.index(f).arrays
        if "members" in arrays:
            out[f] = MemberReads(arrays["members"], starts, ends, arrays.get("segment_crcs"))
    return out


def _compressed(
    ranges: Mapping[int, tuple[np.ndarray, np.ndarray]], plans: Mapping[int, MemberReads]
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """``ranges``, a compressed file's as its members' compressed ranges."""
    return {f: plans[f].compressed if f in plans else r for f, r in ranges.items()}


def _index_size(index: Index) -> int:
    return sum(a.nbytes for a in index.arrays.values())


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
