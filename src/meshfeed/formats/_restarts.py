"""One gzip stream with restart points: written, its table found, a segment inflated.

``meshfeed index --seekable`` could cut a large gzip file into many members, as it does
JSON Lines, and every gzip tool would read it -- but not Python's ``tarfile`` in stream
mode (``"r|gz"``), which is how webdataset reads ``.tgz`` shards: it stops after the
first member ("unexpected end of data"). So a tar shard or TFRecord file is rewritten
as ONE gzip member instead, with a *full flush* every ``SEGMENT`` bytes of data: at a
full flush deflate ends its block on a byte boundary and forgets its window, so the
compressed bytes from there on inflate alone (a raw deflate stream), with nothing
saved from before. Which bytes those are, and each segment's CRC-32, is written in the
gzip header's comment field, which every reader skips (``tarfile`` too; the header's
extra field would do as well, but ``tarfile``'s stream mode misreads it)::

    meshfeed-seekable/1 <segment bytes> <compressed size, CRC-32 as 16 hex digits>...

A read of one sample inflates the segments its range covers and checks their CRCs, as
a read of gzip members would check theirs. The file's length is the header, the
segments, and the 8-byte trailer; a table that disagrees with it is refused.
"""

from __future__ import annotations

import itertools
import struct
import zlib
from collections.abc import Iterable, Iterator

import numpy as np

from meshfeed.storage._blob import Blob

SEGMENT = 1 << 20
"""Data between two restart points when ``meshfeed index --seekable`` rewrites a file."""
MARK = b"meshfeed-seekable/1 "
_HEAD = b"\x1f\x8b\x08\x10\0\0\0\0\0\xff"  # gzip, deflate, a comment; no time; any OS
_ENTRY = 16  # hex digits a segment: its compressed size and CRC-32


class Restarts:
    """A file's restart points: each segment's ``(compressed start, end, data start,
    end)`` (``segments``, end of data filled in by ``ended``) and CRC-32 (``crcs``)."""

    def __init__(self, segments: np.ndarray, crcs: np.ndarray, segment: int) -> None:
        self.segments = segments
        self.crcs = crcs
        self.segment = segment

    def ended(self, data_bytes: int, name: str) -> np.ndarray:
        """The segments, given the data's length as the scan found it (checked)."""
        count = max(1, -(-data_bytes // self.segment))
        if count != len(self.segments):
            raise ValueError(
                f"{name}: its gzip comment lists {len(self.segments)} restart points, but its "
                f"{data_bytes} bytes of data make {count}: the file is corrupt."
            )
        out = self.segments.copy()
        out[:, 3] = np.minimum(out[:, 2] + self.segment, data_bytes)
        return out


def restart_table(blob: Blob) -> Restarts | None:
    """The restart points of a file ``gzip_with_restarts`` wrote; ``None`` for another."""
    head = blob.read(0, len(_HEAD) + len(MARK))
    if head != _HEAD + MARK:
        return None
    size = blob.size()
    at = len(_HEAD)
    text = b""
    while b"\0" not in text and at < size:  # the comment: up to its NUL
        text += blob.read(at + len(text), at + len(text) + (64 << 10))
        if len(text) > 64 << 20:
            break
    comment, nul, _ = text.partition(b"\0")
    words = comment[len(MARK) :].split(b" ")
    entries = words[1] if len(words) == 2 else b""
    if not nul or not words[0].isdigit() or int(words[0]) < 1 or len(entries) % _ENTRY:
        raise ValueError(f"{blob.path}: its gzip comment's table of restart points is corrupt.")
    try:
        table = np.frombuffer(bytes.fromhex(entries.decode("ascii")), ">u4").reshape(-1, 2)
    except (UnicodeDecodeError, ValueError):
        raise ValueError(
            f"{blob.path}: its gzip comment's table of restart points is corrupt."
        ) from None
    sizes = table[:, 0].astype(np.int64)
    starts = at + len(comment) + 1 + np.concatenate([[0], np.cumsum(sizes)[:-1]])
    if not len(sizes) or int(starts[-1] + sizes[-1]) + 8 != size:
        raise ValueError(
            f"{blob.path}: its gzip comment's table of restart points does not fit its size "
            f"({size} bytes): the file is cut short or corrupt."
        )
    segment = int(words[0])
    data_starts = np.arange(len(sizes), dtype=np.int64) * segment
    segments = np.stack([starts, starts + sizes, data_starts, data_starts], axis=1)
    return Restarts(segments, table[:, 1].astype(np.int64), segment)


def inflate_segment(raw: bytes, crc: int, expected: int, name: str, at: int) -> bytes:
    """One segment's data, from its compressed bytes at byte ``at`` (checked)."""
    try:
        data = zlib.decompressobj(-zlib.MAX_WBITS).decompress(raw)
    except zlib.error as error:
        raise ValueError(f"{name}: the gzip data at byte {at} is corrupt ({error}).") from None
    if len(data) != expected or zlib.crc32(data) != crc:
        raise ValueError(
            f"{name}: the gzip data at byte {at} does not match its CRC: the file is corrupt."
        )
    return data


def segments(pieces: Iterable[bytes], segment: int) -> Iterator[bytes]:
    """The data of ``pieces`` cut in ``segment`` bytes (the last one shorter, or empty
    for no data)."""
    pending = []
    held = 0
    given = False
    for piece in pieces:
        pending.append(piece)
        held += len(piece)
        while held >= segment:
            data = b"".join(pending)
            yield data[:segment]
            given = True
            pending, held = [data[segment:]], held - segment
    if held or not given:
        yield b"".join(pending)


def gzip_with_restarts(pieces: Iterable[bytes], segment: int = SEGMENT) -> bytes:
    """The data of ``pieces`` as one gzip member with a restart point every ``segment``
    bytes, and their table in its comment (the module docstring)."""
    compressor = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    body: list[bytes] = []
    table: list[str] = []
    crc = total = 0
    last = None
    for data in itertools.chain(segments(pieces, segment), [None]):  # flushed once the next is seen
        if last is not None:
            mode = zlib.Z_FINISH if data is None else zlib.Z_FULL_FLUSH
            out = compressor.compress(last) + compressor.flush(mode)
            body.append(out)
            table.append(f"{len(out):08x}{zlib.crc32(last):08x}")
            crc, total = zlib.crc32(last, crc), total + len(last)
        last = data
    comment = MARK + f"{segment} ".encode() + "".join(table).encode() + b"\0"
    trailer = struct.pack("<II", crc, total & 0xFFFFFFFF)
    return b"".join([_HEAD, comment, *body, trailer])
