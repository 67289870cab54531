"""Compressed streaming files read by member: scanned as they decompress, read a member
at a time, rewritten seekable.

A gzip file may hold several members one after another, a zstandard file several frames,
each decompressible on its own from its first byte, and any tool reads them as one
stream (``storage._compressed``). A compressed tar shard (``.tgz``, ``.tar.gz``,
``.tar.zst``) or TFRecord file (``.tfrecord.gz``) is indexed over its decompressed
stream (``Inflating``: the scan's reader, decompressing as the scan goes forward), and
its index records each member's compressed and decompressed extent -- or, in a gzip
file ``meshfeed index --seekable`` wrote, each segment between two restart points
(``_restarts``) -- beside the samples' offsets in the decompressed stream. A read then
decompresses only the members a sample's byte range covers (``MemberReads``): two, for
a sample that straddles a boundary. A file of one large member, what ``tar czf`` and
``gzip`` write, could only be read by decompressing all of it for each sample, so its
index is refused with the command that rewrites it seekable, a restart point every
1 MiB of data (``rewrite_seekable``), still one valid stream for every other tool:
``meshfeed index --seekable FILE``.

Decompression is fed 64 KiB of compressed bytes at a time, so a file that inflates
without bound (deflate's ratio reaches ~1000:1) holds at most ~64 MiB at once.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Generator
from typing import Any

import numpy as np

from meshfeed.formats._index import READ, Index, ReadAhead
from meshfeed.formats._restarts import (
    SEGMENT,
    gzip_with_restarts,
    inflate_segment,
    restart_table,
    segments,
)
from meshfeed.storage._blob import Blob
from meshfeed.storage._compressed import (
    GZIP,
    Inflater,
    compression_of,
    inflate_member,
)
from meshfeed.storage._file_errors import named

MAX_MEMBER = 16 << 20
"""The largest decompressed member a read of one sample may decompress (16 MiB)."""
FEED = 64 << 10
"""Compressed bytes given to the decompressor at a time (the module docstring)."""
UNKNOWN = sys.maxsize
"""``Inflating.size`` before the stream's end is reached."""


def compression(path: str) -> str | None:
    """``"gzip"``, ``"zstd"`` or ``None``, by the file's suffix (``.tgz`` is gzip)."""
    if path.rsplit("/", 1)[-1].lower().endswith(".tgz"):
        return GZIP
    return compression_of(path)


def seekable_command(path: str, kind: str, largest: int, what: str) -> str:
    """Why a file of one large member is refused, and the command that rewrites it."""
    return (
        f"{path} holds a {kind} member of {largest / 2**20:.0f} MiB decompressed: reading "
        f"one {what} would decompress all of it. Rewrite it seekable (a restart point every "
        f"1 MiB, still one valid {kind} stream for any tool): meshfeed index --seekable {path}"
    )


def _inflated(blob: Blob, inflater: Inflater, reader: ReadAhead) -> Generator[bytes]:
    """The decompressed stream of ``blob``, piece after piece; checked whole at its end."""
    for chunk in reader.chunks():
        view = memoryview(chunk)
        for at in range(0, len(view), FEED):
            yield from inflater.feed(view[at : at + FEED])  # type: ignore[arg-type]
    inflater.close()


class Inflating:
    """The decompressed stream of a compressed file, read forward, for a scan: the
    interface of ``ReadAhead`` (``read_in``, ``read``, ``size``), where ``size`` is
    ``UNKNOWN`` until a read reaches the end. Data before a read's start is dropped, so a
    scan that skips a large member holds none of it."""

    def __init__(self, blob: Blob, kind: str) -> None:
        self.name = blob.path
        self.inflater = Inflater(kind, blob.path)
        self._reader = ReadAhead(blob)
        self._pieces = _inflated(blob, self.inflater, self._reader)
        self._held: list[bytes] = []  # decompressed pieces from byte ``_base`` on
        self._base = 0
        self._end = 0  # decompressed bytes produced so far
        self.size = UNKNOWN

    def _more(self) -> bool:
        """One more decompressed piece held; ``False`` at the end of the stream."""
        for piece in self._pieces:
            if piece:
                self._held.append(piece)
                self._end += len(piece)
                return True
        self.size = self._end
        return False

    def _drop(self, start: int) -> None:
        """Drops the pieces that end before ``start`` (never joined)."""
        while self._held and self._base + len(self._held[0]) <= start:
            self._base += len(self._held.pop(0))

    def read_in(self, start: int, count: int) -> tuple[bytes, int]:
        """At least ``count`` bytes from ``start`` (fewer at the end), usually more, as a
        buffer and where ``start`` lies in it; never before an earlier read's start."""
        if start < self._base:
            raise RuntimeError(f"{self.name}: a read at byte {start}, after one at {self._base}")
        self._drop(start)
        while self._end < start + max(count, READ) and self._more():
            self._drop(start)
        if not self._held:  # at or past the end
            self._base = max(self._base, min(start, self._end))
            return b"", 0
        if len(self._held) > 1 or self._base < start:  # one buffer from ``start`` on
            skip = start - self._base
            self._held = [b"".join([memoryview(self._held[0])[skip:], *self._held[1:]])]
            self._base = start
        return self._held[0], 0

    def read(self, start: int, count: int) -> bytes:
        """``read_in`` as a copy from ``start``."""
        data, skip = self.read_in(start, count)
        return data[skip:] if skip else data

    def finish(self) -> np.ndarray:
        """The rest of the stream decompressed (and checked whole); every member's
        ``(compressed start, end, decompressed start, end)``, one row each."""
        for _ in self._pieces:
            pass
        return np.array(self.inflater.members, np.int64).reshape(-1, 4)

    def __enter__(self) -> Inflating:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._pieces.close()
        self._reader.__exit__(*exc)


def scan_file(blob: Blob, scan: Callable[[Any, str], Index], what: str) -> Index:
    """``scan(reader, name)`` over a file, plain or compressed (its members read as they
    decompress); an error names the file. ``what``: its unit, ``"sample"``."""
    kind = compression(blob.path)
    with named(blob.path, "indexing it"):
        if kind is not None:
            return scan_members(blob, kind, scan, what)
        with ReadAhead(blob) as reader:
            return scan(reader, blob.path)


def scan_members(
    blob: Blob, kind: str, scan: Callable[[Inflating, str], Index], what: str
) -> Index:
    """``scan`` over the decompressed stream of ``blob``, its index given the members, or
    the segments between restart points (and refused for a file of one large member:
    the module docstring)."""
    restarts = restart_table(blob) if kind == GZIP else None
    with Inflating(blob, kind) as inflating:
        index = scan(inflating, blob.path)
        members = inflating.finish()
    data_bytes = int(members[-1, 3]) if len(members) else 0
    if restarts is not None:
        members = restarts.ended(data_bytes, blob.path)
        index.arrays["segment_crcs"] = restarts.crcs
    largest = int((members[:, 3] - members[:, 2]).max()) if len(members) else 0
    if largest > MAX_MEMBER and index.samples > 1:
        raise ValueError(seekable_command(blob.path, kind, largest, what))
    index.arrays["members"] = members
    index.meta.update(compression=kind, data_bytes=data_bytes)
    return index


class MemberReads:
    """Byte ranges of a compressed file's decompressed stream, as the members that hold
    them: which members to read (``needed``, their compressed ``starts`` and ``ends``),
    and each range cut from them once they are decompressed (``cut``)."""

    def __init__(
        self,
        members: np.ndarray,
        starts: np.ndarray,
        ends: np.ndarray,
        crcs: np.ndarray | None = None,
    ) -> None:
        self.members = members
        self.crcs = crcs
        self.starts, self.ends = starts.astype(np.int64), ends.astype(np.int64)
        beginnings = members[:, 2]
        self.first = np.maximum(np.searchsorted(beginnings, self.starts, side="right") - 1, 0)
        last_byte = np.maximum(self.ends - 1, self.starts)  # an empty range: its first member
        self.last = np.maximum(np.searchsorted(beginnings, last_byte, side="right") - 1, self.first)
        counts = self.last - self.first + 1
        ranks = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        self.needed = np.unique(np.repeat(self.first, counts) + ranks)

    @property
    def compressed(self) -> tuple[np.ndarray, np.ndarray]:
        """The compressed byte ranges of the members needed."""
        return self.members[self.needed, 0], self.members[self.needed, 1]

    def cut(self, kind: str, raws: list[bytes], name: str) -> list[bytes]:
        """Each range's bytes, from the needed members' compressed bytes (in order)."""
        texts = {}
        for m, raw in zip(self.needed.tolist(), raws, strict=True):
            if self.crcs is None:  # gzip members, zstandard frames
                texts[m] = inflate_member(kind, raw, name)
            else:  # segments between restart points
                c0, _, d0, d1 = self.members[m].tolist()
                texts[m] = inflate_segment(raw, int(self.crcs[m]), d1 - d0, name, c0)
        out = []
        for s, e, a, b in zip(
            self.starts.tolist(),
            self.ends.tolist(),
            self.first.tolist(),
            self.last.tolist(),
            strict=True,
        ):
            data = texts[a] if a == b else b"".join(texts[m] for m in range(a, b + 1))
            base = int(self.members[a, 2])
            out.append(data[s - base : e - base])
        return out


def needs_rewrite(blob: Blob, kind: str) -> bool:
    """Whether ``rewrite_seekable`` would change the file: it has no restart points and
    a member of more than twice ``SEGMENT`` bytes of data (decompressed only as far as
    the first such member)."""
    if kind == GZIP and restart_table(blob) is not None:
        return False
    inflater = Inflater(kind, blob.path)
    with ReadAhead(blob) as reader:
        out = 0
        for piece in _inflated(blob, inflater, reader):
            out += len(piece)
            start = inflater.members[-1][3] if inflater.members else 0
            if out - start > 2 * SEGMENT:
                return True
        return any(m[3] - m[2] > 2 * SEGMENT for m in inflater.members)


def rewrite_seekable(blob: Blob, kind: str) -> bytes:
    """The file's data compressed again with a restart point every ``SEGMENT`` bytes of
    data, cut at fixed offsets (a sample may straddle two; a read takes both): gzip as
    one member (``_restarts``), zstandard as frames."""
    with ReadAhead(blob) as reader:
        pieces = _inflated(blob, Inflater(kind, blob.path), reader)
        if kind == GZIP:
            return gzip_with_restarts(pieces)
        import zstandard  # the read above needed it: installed

        frames = zstandard.ZstdCompressor(write_checksum=True)  # a frame's reads checked
        return b"".join(frames.compress(s) for s in segments(pieces, SEGMENT))
