"""gzip and zstandard streams: decompressed as they arrive, their members on record.

A gzip file may hold several members one after another, and a zstandard file several
frames; any tool reads them as one stream, and each one can be decompressed on its own
from its first byte. ``Inflater`` decompresses a stream fed in chunks, yields the data
as it comes, and records each member's compressed and decompressed extent -- which is
what lets an index read one record of a large compressed file by decompressing only the
member that holds it. At the end it checks that the stream ends where its last member
does: a truncated file is named, never read short.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any

GZIP, ZSTD = "gzip", "zstd"
"""The compressions read."""
Member = tuple[int, int, int, int]
"""``(compressed start, compressed end, decompressed start, decompressed end)``."""


class CorruptStream(ValueError):
    """A compressed file that is corrupt, truncated, or not of its kind."""


def compression_of(path: str) -> str | None:
    """``"gzip"``, ``"zstd"`` or ``None``, by the file's suffix."""
    name = path.lower()
    if name.endswith(".gz"):
        return GZIP
    if name.endswith((".zst", ".zstd")):
        return ZSTD
    return None


def _zstandard() -> Any:
    try:
        import zstandard
    except ImportError:
        raise ImportError(
            "reading .zst needs zstandard: pip install 'meshfeed[text]' (from a clone: pip "
            "install -e '.[text]')."
        ) from None
    return zstandard


class Inflater:
    """Decompresses one gzip or zstandard stream fed in chunks (the module docstring)."""

    def __init__(self, kind: str, name: str) -> None:
        self.kind = kind
        self.name = name
        self.members: list[Member] = []
        self._fed = 0  # compressed bytes fed so far
        self._out = 0  # decompressed bytes produced so far
        self._start = (0, 0)  # where the current member started
        self._open = False  # the current member has been fed something
        self._d = self._new()

    def _new(self) -> Any:
        if self.kind == GZIP:
            return zlib.decompressobj(wbits=31)
        return _zstandard().ZstdDecompressor().decompressobj()

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        """The decompressed data of ``chunk`` (possibly in several pieces)."""
        errors: tuple[type[BaseException], ...] = (zlib.error,)
        if self.kind == ZSTD:
            errors = (_zstandard().ZstdError,)
        end_of_chunk = self._fed + len(chunk)
        while chunk:
            try:
                data = self._d.decompress(chunk)
            except errors as error:
                what = "gzip" if self.kind == GZIP else "zstandard"
                message = f"{self.name}: not a {what} stream, or corrupt ({error})"
                raise CorruptStream(message) from None
            self._open = True
            self._out += len(data)
            if data:
                yield data
            if self._d.eof:  # a member ended: another may follow
                chunk = self._d.unused_data
                end = end_of_chunk - len(chunk)
                self.members.append((self._start[0], end, self._start[1], self._out))
                self._start = (end, self._out)
                self._open = False
                self._d = self._new()
            else:
                chunk = b""
        self._fed = end_of_chunk

    def close(self) -> None:
        """Raises if the stream stopped inside a member (a truncated file)."""
        if self._open:
            raise CorruptStream(
                f"{self.name}: truncated (the {self.kind} stream ends inside its last "
                f"{'member' if self.kind == GZIP else 'frame'})"
            )


def inflate_member(kind: str, data: bytes, name: str) -> bytes:
    """One member, decompressed whole (its compressed bytes, as the index located them)."""
    inflater = Inflater(kind, name)
    out = b"".join(inflater.feed(data))
    inflater.close()
    return out


def compress_members(kind: str, data: bytes, member_bytes: int) -> bytes:
    """``data`` compressed as members of ``member_bytes`` of input each, cut at newlines
    (what ``meshfeed index --seekable`` writes): any tool reads the result as one stream."""
    out, start = [], 0
    while start < len(data):
        end = data.find(b"\n", min(len(data), start + member_bytes) - 1)
        end = len(data) if end < 0 else end + 1
        piece = data[start:end]
        if kind == GZIP:
            compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
            out.append(compressor.compress(piece) + compressor.flush())
        else:
            out.append(_zstandard().ZstdCompressor().compress(piece))
        start = end
    return b"".join(out)
