"""WebDataset tar shards indexed: their headers walked, their members grouped by key.

``scan_tar`` indexes a shard by reading its 512-byte headers only: each header says how
far the next one is, so large members are skipped over, not read (locally a ``pread``
per few MiB of small members; behind a URL, one range request per 8 MiB of headers).
ustar, GNU (long names, base-256 sizes) and pax (long names, large sizes) headers are
understood, which covers the shards of webdataset's ``TarWriter``/``ShardWriter``
(Python's ``tarfile``) and of GNU ``tar``. A header whose checksum is wrong, a member
that runs past the end of the file, or a file without the end-of-archive marker is
named with its offset. A sample is the run of members sharing a key -- the member's
path up to the first dot of its file name, as webdataset splits it -- and a member
without an extension belongs to none.
"""

from __future__ import annotations

import numpy as np

from meshfeed.formats._index import INDEX_FORMAT, Index, ReadAhead
from meshfeed.storage._blob import Blob

BLOCK = 512


class TarError(ValueError):
    """A tar shard that is corrupt or truncated."""


def _number(field: bytes, offset: int, name: str) -> int:
    if field and field[0] & 0x80:  # GNU base-256 for large sizes
        return int.from_bytes(field[1:], "big")
    text = field.rstrip(b"\0 ").strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise TarError(
            f"{name}: the tar header at byte {offset} is corrupt (a bad number)."
        ) from None


def _pax(data: bytes) -> dict[str, str]:
    records, at = {}, 0
    while at < len(data):
        space = data.index(b" ", at)
        length = int(data[at:space])
        key, _, value = data[space + 1 : at + length - 1].partition(b"=")
        records[key.decode()] = value.decode("utf-8", "surrogateescape")
        at += length
    return records


def _octal(fields: np.ndarray) -> np.ndarray:
    """Each row's octal number (tar's numeric fields: digits, then a NUL or a space),
    vectorised over rows."""
    digits = fields.astype(np.int64) - 48
    is_digit = (digits >= 0) & (digits <= 7)
    value = np.zeros(len(fields), np.int64)
    started = np.zeros(len(fields), bool)
    done = np.zeros(len(fields), bool)
    for k in range(fields.shape[1]):
        done |= started & ~is_digit[:, k]
        take = is_digit[:, k] & ~done
        value = np.where(take, value * 8 + digits[:, k], value)
        started |= is_digit[:, k]
    return value


def _check_sums(buffer: bytes, offsets: list[int], base: int, name: str) -> None:
    """Every header at ``offsets`` of ``buffer`` matches its checksum (all at once)."""
    if not offsets:
        return
    # Headers sit on 512-byte blocks and the buffer starts on one: pick rows, no gather.
    rows = np.frombuffer(buffer, np.uint8, count=len(buffer) // BLOCK * BLOCK).reshape(-1, BLOCK)
    blocks = rows[np.asarray(offsets) // BLOCK]
    total = np.add.reduce(blocks, axis=1, dtype=np.uint32).astype(np.int64)
    total -= np.add.reduce(blocks[:, 148:156], axis=1, dtype=np.uint32).astype(np.int64) - 8 * 32
    bad = np.flatnonzero(total != _octal(blocks[:, 148:156]))
    if len(bad):
        at = base + offsets[int(bad[0])]
        raise TarError(
            f"{name}: the tar header at byte {at} is corrupt (checksum); is it a tar file?"
        )


def scan_tar(blob: Blob) -> Index:
    """The index of one tar shard (the module docstring)."""
    with ReadAhead(blob) as reader:
        return _scan(reader, blob.path, reader.size)


def _scan(reader: ReadAhead, name: str, size: int) -> Index:
    """The walk from header to header, a buffer of a few MiB at a time.

    Within a buffer the walk is vectorised: every 512-byte block is read as if it were a
    header (its size field parsed with numpy), which gives each block the position of
    the block that would follow it; following those positions from a real header visits
    exactly the headers, in a Python loop of a list lookup each. The headers found are
    then checked together (checksums, kinds, sizes), and only regular members and pax
    records are looked at one by one.
    """
    members: list[tuple[bytes, int, int]] = []  # (raw path, data offset, size)
    # Runs of members met on the fast path, kept as arrays: (names [n, 100], data offsets,
    # sizes), and where in ``members`` each run goes.
    runs: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []
    pax: tuple[bytes | None, int | None] = (None, None)  # a pax or GNU header's path, size
    at = 0
    while at + BLOCK <= size:
        buffer = reader.read(at, BLOCK)
        count = len(buffer) // BLOCK
        rows = np.frombuffer(buffer, np.uint8, count=count * BLOCK).reshape(count, BLOCK)
        # A size field is 11 octal digits as writers write it: one product parses every
        # block's; a header written otherwise is parsed alone, in the walk.
        digits = rows[:, 124:135].astype(np.int64) - 48
        sizes = np.asarray(digits @ _PLACES, np.int64)
        standard = np.asarray(((digits >= 0) & (digits <= 7)).all(axis=1), bool)
        follow = (np.arange(count) + 1 + -(-sizes // BLOCK)).tolist()
        first, simple = rows[:, 0].tolist(), standard.tolist()
        chain, i = [], 0
        zero = False
        while i < count:
            if first[i] == 0 and not rows[i].any():
                zero = True
                break
            if not simple[i]:
                if rows[i, 124] >= 0x80:
                    break  # GNU base-256: parsed one by one below
                sizes[i] = _octal(rows[i : i + 1, 124:136])[0]
                follow[i] = i + 1 + -(-int(sizes[i]) // BLOCK)
            chain.append(i)
            i = follow[i]
        if chain:
            _check_sums(buffer, [c * BLOCK for c in chain], at, name)
        if chain and pax == _NO_PAX and _plain_files(rows, chain, sizes, at, size):
            # Only files, and pax headers of times (webdataset's shards, GNU tar's): the
            # names are all that is left to read one by one.
            headers = np.asarray(chain)
            files = headers[rows[headers, 156] != _PAX_HEADER]
            runs.append(
                (len(members), rows[files, :100].copy(), at + (files + 1) * BLOCK, sizes[files])
            )
        else:
            lengths = sizes[chain].tolist() if chain else []
            for c, length in zip(chain, lengths, strict=True):
                kind = buffer[c * BLOCK + 156]
                pax = _member(
                    buffer,
                    c * BLOCK,
                    at + c * BLOCK,
                    kind,
                    length,
                    pax,
                    members,
                    reader,
                    name,
                    size,
                )
        if zero:
            break
        at += i * BLOCK
        if i < count and not zero and rows[i, 124] >= 0x80:  # GNU base-256: this header alone
            o = i * BLOCK
            _check_sums(buffer, [o], at - i * BLOCK, name)
            length = _number(buffer[o + 124 : o + 136], at, name)
            pax = _member(buffer, o, at, buffer[o + 156], length, pax, members, reader, name, size)
            at += BLOCK + -(-length // BLOCK) * BLOCK
    else:  # no end-of-archive blocks: the file stops early
        last = f"after member {members[-1][0].decode(errors='replace')!r} " if members else ""
        raise TarError(
            f"{name}: truncated: it stops {last}at byte {min(at, size)} of {size}, before the "
            "tar end-of-archive marker."
        )
    if not members:  # every member on the fast path: grouped without a loop as well
        if not runs:
            return _samples([], name)
        grouped = _samples_of_names(*(np.concatenate([r[k] for r in runs]) for k in (1, 2, 3)))
        if grouped is not None:
            return grouped
    for where, names, offsets, lengths in reversed(runs):  # the runs back in their places
        paths = [row.tobytes().rstrip(b"\0") for row in names]
        members[where:where] = list(zip(paths, offsets.tolist(), lengths.tolist(), strict=True))
    return _samples(members, name)


def _samples_of_names(names: np.ndarray, offsets: np.ndarray, sizes: np.ndarray) -> Index | None:
    """``_samples`` vectorised over the members' 100-byte name fields; ``None`` where a
    case needs the general path (an extension over 16 bytes, a repeated extension)."""
    columns = np.arange(100)
    ends = np.where((names == 0).any(1), (names == 0).argmax(1), 100)
    inside = columns < ends[:, None]
    slash = np.where(inside & (names == ord("/")), columns, -1).max(1)
    dots = inside & (names == ord(".")) & (columns > slash[:, None])
    dot = dots.argmax(1)
    keep = dots.any(1) & (dot < ends - 1)  # an extension, and not an empty one
    names, offsets, sizes, ends, dot = (
        names[keep],
        offsets[keep],
        sizes[keep],
        ends[keep],
        dot[keep],
    )
    width = ends - dot - 1
    if not len(names) or (width > 16).any():
        return None
    same = (dot[1:] == dot[:-1]) & ((names[1:] == names[:-1]) | (columns >= dot[1:, None])).all(1)
    start = np.concatenate([[True], ~same])
    sample = np.cumsum(start) - 1
    picks = np.minimum(dot[:, None] + 1 + np.arange(16), 99)
    exts = np.where(np.arange(16) < width[:, None], np.take_along_axis(names, picks, 1), 0)
    kinds, column = np.unique(np.ascontiguousarray(exts).view("V16").ravel(), return_inverse=True)
    if len(np.unique(sample * len(kinds) + column)) != len(sample):
        return None  # a sample with one extension twice: the general path names it
    offsets_of = np.full((int(sample[-1]) + 1, len(kinds)), -1, np.int64)
    sizes_of = np.full_like(offsets_of, -1)
    offsets_of[sample, column], sizes_of[sample, column] = offsets, sizes
    firsts, key_ends = names[start], dot[start]
    keys = firsts[columns < key_ends[:, None]]
    key_offsets = np.concatenate([[0], np.cumsum(key_ends)]).astype(np.int64)
    fields = [k.tobytes().rstrip(b"\0").decode("utf-8", "surrogateescape") for k in kinds]
    meta = {"format": INDEX_FORMAT, "kind": "tar", "samples": len(firsts), "fields": fields}
    arrays = {
        "offsets": offsets_of,
        "sizes": sizes_of,
        "keys": np.ascontiguousarray(keys),
        "key_offsets": key_offsets,
    }
    return Index(meta, arrays)


def _plain_files(rows: np.ndarray, chain: list[int], sizes: np.ndarray, at: int, size: int) -> bool:
    """Whether the headers ``chain`` are regular files without a ustar prefix, and pax
    headers that hold neither a path nor a size, all whole in the file and the buffer."""
    headers = np.asarray(chain)
    kinds = rows[headers, 156]
    files = (kinds == _FILE) | (kinds == 0) | (kinds == ord("7"))
    pax = kinds == _PAX_HEADER
    if not (files | pax).all() or rows[headers[files], 345].any():
        return False
    ends = (headers + 1) * BLOCK + sizes[headers]
    if (at + ends > size).any():
        return False  # _member names the truncation
    if pax.any():
        extended = headers[pax]
        if (sizes[extended] > BLOCK).any() or (extended + 1 >= len(rows)).any():
            return False
        records = rows[extended + 1]
        for word in (b" path=", b" size="):  # any occurrence, at any place in the block
            found = np.ones((len(extended), BLOCK - len(word) + 1), bool)
            for k, byte in enumerate(word):
                found &= records[:, k : BLOCK - len(word) + 1 + k] == byte
            if found.any():
                return False
    return True


def _member(
    buffer: bytes, o: int, at: int, kind: int, length: int,
    pax: tuple[bytes | None, int | None], members: list[tuple[bytes, int, int]],
    reader: ReadAhead, name: str, size: int,
) -> tuple[bytes | None, int | None]:  # fmt: skip
    """One header at ``buffer[o]`` (byte ``at`` of the file); returns the pending pax."""
    data = at + BLOCK
    if data + length > size:
        what = buffer[o : o + 100].rstrip(b"\0").decode("utf-8", "replace")
        raise TarError(
            f"{name}: truncated: member {what!r} at byte {at} needs {length} bytes, the "
            f"file ends {size - data} bytes after its header."
        )
    if kind in _REGULAR:
        path = buffer[o : o + 100].rstrip(b"\0")
        if buffer[o + 345] and buffer[o + 257 : o + 263] == b"ustar\0":
            path = buffer[o + 345 : o + 500].rstrip(b"\0") + b"/" + path
        pax_path, pax_size = pax
        if pax_path is not None:
            path = pax_path
        if pax_size is not None:
            length = pax_size
            if data + length > size:
                raise TarError(f"{name}: truncated: member {path!r} at byte {at} runs past it.")
        members.append((path, data, length))
        return (None, None)
    if kind in _PAX or kind == _LONG_NAME:
        start = o + BLOCK
        records = (
            buffer[start : start + length]
            if start + length <= len(buffer)
            else reader.read(data, length)[:length]
        )
        if kind == _LONG_NAME:
            return (records.rstrip(b"\0"), pax[1])
        if b" path=" not in records and b" size=" not in records:  # only times: nothing to us
            return pax
        fields = _pax(records)
        path = fields["path"].encode("utf-8", "surrogateescape") if "path" in fields else pax[0]
        return (path, int(fields["size"]) if "size" in fields else pax[1])
    return pax if kind == _GLOBAL else (None, None)


_ZERO = bytes(BLOCK)
_PLACES = 8 ** np.arange(10, -1, -1, dtype=np.int64)
_FILE, _PAX_HEADER = ord("0"), ord("x")
_NO_PAX: tuple[bytes | None, int | None] = (None, None)
_REGULAR = (ord("0"), 0, ord("7"))
_PAX = (ord("x"), ord("X"))
_LONG_NAME, _GLOBAL = ord("L"), ord("g")


def _samples(members: list[tuple[bytes, int, int]], name: str) -> Index:
    """Members grouped into samples by key, a column per extension."""
    keys: list[bytes] = []
    columns: dict[bytes, int] = {}  # extension -> its column, in the order first seen
    rows: list[int] = []
    cols: list[int] = []
    offs: list[int] = []
    lens: list[int] = []
    seen: set[bytes] = set()  # the current sample's extensions
    last, sample = None, -1
    for path, offset, length in members:
        dot = path.find(b".", path.rfind(b"/") + 1)
        if dot < 0 or dot == len(path) - 1:
            continue  # no extension: no field
        key, ext = path[:dot], path[dot + 1 :]
        if key != last:
            keys.append(key)
            last, sample, seen = key, sample + 1, set()
        elif ext in seen:
            raise TarError(f"{name}: sample {key!r} holds two {ext!r} members.")
        seen.add(ext)
        column = columns.get(ext)
        if column is None:
            column = columns[ext] = len(columns)
        rows.append(sample)
        cols.append(column)
        offs.append(offset)
        lens.append(length)
    exts = sorted(columns)
    to_sorted = np.zeros(len(exts), np.int64)  # first-seen column -> its sorted column
    to_sorted[[columns[e] for e in exts]] = np.arange(len(exts))
    where = (np.asarray(rows, np.int64), to_sorted[np.asarray(cols, np.int64)])
    offsets = np.full((len(keys), len(exts)), -1, np.int64)
    sizes = np.full((len(keys), len(exts)), -1, np.int64)
    offsets[where], sizes[where] = offs, lens
    key_offsets = np.concatenate([[0], np.cumsum([len(k) for k in keys])]).astype(np.int64)
    names = [e.decode("utf-8", "surrogateescape") for e in exts]
    meta = {"format": INDEX_FORMAT, "kind": "tar", "samples": len(keys), "fields": names}
    keys_bytes = np.frombuffer(b"".join(keys), np.uint8)
    arrays = {"offsets": offsets, "sizes": sizes, "keys": keys_bytes, "key_offsets": key_offsets}
    return Index(meta, arrays)
