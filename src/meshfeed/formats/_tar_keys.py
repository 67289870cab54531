"""A tar shard's members grouped into samples, by key, as webdataset groups them.

A sample is the run of members sharing a key -- the member's path up to the first dot
of its file name -- with a column per extension (sorted), and a member without an
extension belongs to none. ``group`` does it member by member; ``group_names`` does it
with numpy over the members' 100-byte name fields at once, as ``scan_tar`` collects
them from a shard of regular files (webdataset's), and gives up (``None``) on what it
does not cover, for ``group`` to do. Both make the same index.
"""

from __future__ import annotations

import numpy as np

from meshfeed.formats._index import INDEX_FORMAT, Index


class TarError(ValueError):
    """A tar shard that is corrupt or truncated."""


def group(members: list[tuple[bytes, int, int]], name: str) -> Index:
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


def group_names(names: np.ndarray, offsets: np.ndarray, sizes: np.ndarray) -> Index | None:
    """``group`` vectorised over the members' 100-byte name fields; ``None`` where a
    case needs the general path (an extension over 16 bytes, a repeated extension).

    Names are short: only the columns some name uses are kept, in whole 8-byte words so
    that two keys compare as a few numbers; a row's first or last match is an ``argmax``
    (numpy reduces long rows quickly, short ones one by one).
    """
    used = np.flatnonzero(np.bitwise_or.reduce(names, axis=0))
    if not len(used):
        return None
    width = -(-(int(used[-1]) + 1) // 8) * 8
    padded = np.zeros((len(names), width + 16), np.uint8)  # room for an extension past it
    padded[:, : min(width, names.shape[1])] = names[:, :width]
    names, every, columns = padded[:, :width], np.arange(len(names)), np.arange(width)
    nul = names == 0
    ends = nul.argmax(1)
    ends[~nul[every, ends]] = width  # no NUL: the name fills the field
    inside = columns < ends[:, None]
    slashes = inside & (names == ord("/"))
    slash = width - 1 - slashes[:, ::-1].argmax(1)
    slash[~slashes[every, slash]] = -1
    dots = inside & (names == ord(".")) & (columns > slash[:, None])
    dot = dots.argmax(1)
    keep = dots[every, dot] & (dot < ends - 1)  # an extension, and not an empty one
    if not keep.all():
        padded, names, offsets, sizes = padded[keep], names[keep], offsets[keep], sizes[keep]
        ends, dot = ends[keep], dot[keep]
    lengths = ends - dot - 1
    if not len(names) or (lengths > 16).any():
        return None
    words = np.where(columns < dot[:, None], names, 0).view(np.uint64)  # the keys
    same = dot[1:] == dot[:-1]
    for k in range(width // 8):
        same &= words[1:, k] == words[:-1, k]
    start = np.concatenate([[True], ~same])
    sample = np.cumsum(start) - 1
    exts = np.empty((len(names), 16), np.uint8)
    for at in np.unique(dot).tolist():  # a slice for each place of the dot (keys of one length)
        exts[dot == at] = padded[dot == at, at + 1 : at + 17]
    exts[np.arange(16) >= lengths[:, None]] = 0
    kinds, column = _distinct(exts)
    if np.bincount(sample * len(kinds) + column).max() > 1:
        return None  # a sample with one extension twice: the general path names it
    offsets_of = np.full((int(sample[-1]) + 1, len(kinds)), -1, np.int64)
    sizes_of = np.full_like(offsets_of, -1)
    offsets_of[sample, column], sizes_of[sample, column] = offsets, sizes
    firsts, key_ends = names[start], dot[start]
    keys = firsts[columns < key_ends[:, None]]
    key_offsets = np.concatenate([[0], np.cumsum(key_ends)]).astype(np.int64)
    fields = [k.rstrip(b"\0").decode("utf-8", "surrogateescape") for k in kinds]
    meta = {"format": INDEX_FORMAT, "kind": "tar", "samples": len(firsts), "fields": fields}
    arrays = {
        "offsets": offsets_of,
        "sizes": sizes_of,
        "keys": np.ascontiguousarray(keys),
        "key_offsets": key_offsets,
    }
    return Index(meta, arrays)


def _distinct(exts: np.ndarray) -> tuple[list[bytes], np.ndarray]:
    """The distinct rows of ``exts`` (16 bytes each) in byte order, and each row's."""
    words = exts.view(">u8")  # big-endian: the numbers sort as the bytes do
    if not words[:, 1].any():  # extensions of 8 bytes at most: one number each
        values = np.unique(words[:, 0])
        return [int(v).to_bytes(8, "big") for v in values], np.searchsorted(values, words[:, 0])
    values, inverse = np.unique(exts.view("V16").ravel(), return_inverse=True)
    return [v.tobytes() for v in values], inverse.ravel()
