"""WebDataset tar shards, read by index: ``TarSource``.

A WebDataset shard is a plain tar file whose members are grouped into samples by *key*:
``000123.jpg``, ``000123.json`` and ``000123.cls`` are the ``jpg``, ``json`` and ``cls``
fields of sample ``000123`` (the key is the member's path up to the first dot of its
file name, as webdataset itself splits it; consecutive members with one key make one
sample). Members without an extension, directories and links belong to no sample.

``scan_tar`` indexes a shard by reading its 512-byte headers only: each header says how
far the next one is, so large members are skipped over, not read (locally a ``pread``
per few MiB of small members; behind a URL, one range request per 8 MiB of headers).
ustar, GNU (long names) and pax (long names, large sizes) headers are understood, which
covers the shards of webdataset's ``TarWriter``/``ShardWriter`` (Python's ``tarfile``)
and of GNU ``tar``. A header whose checksum is wrong, or a member that runs past the end
of the file, is named with its offset.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from meshfeed.data._blob import Blob
from meshfeed.data._cache import CACHE_BYTES
from meshfeed.data._remote import RETRY_S
from meshfeed.data._sources import FieldSpec, fields_text
from meshfeed.formats._index import INDEX_FORMAT, Index
from meshfeed.formats._indexed import IndexedFiles

BLOCK = 512
READ = 8 << 20  # header bytes fetched at a time
OBJECT = np.dtype(object)
TarMissing = Literal["error", "mark"]
"""What ``TarSource`` does with a sample that lacks one of the shards' extensions: refuse
the shards (naming it), or give an empty value and a ``<ext>_missing`` flag."""
TarDecoder = str | Callable[[bytes], Any]
"""A member's decoding: ``"bytes"`` (as is), ``"text"``, ``"json"``, ``"int"``,
``"float"``, ``"npy"``, or a function of the bytes."""
_NUMERIC = {"int": np.dtype(np.int64), "float": np.dtype(np.float64)}


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


def scan_tar(blob: Blob) -> Index:
    """The index of one tar shard (the module docstring)."""
    name, size = blob.path, blob.size()
    buffer, base = b"", 0

    def read(start: int, count: int) -> bytes:
        nonlocal buffer, base
        if not (base <= start and start + count <= base + len(buffer)):
            buffer, base = blob.read(start, min(size, start + max(count, READ))), start
        return buffer[start - base : start - base + count]

    members: list[tuple[str, int, int]] = []  # (path, data offset, size)
    pax: dict[str, str] = {}
    long_name: str | None = None
    at = 0
    while at + BLOCK <= size:
        header = read(at, BLOCK)
        if header == bytes(BLOCK):
            break  # the end-of-archive blocks
        recorded = _number(header[148:156], at, name)
        if sum(header[:148]) + 8 * 32 + sum(header[156:]) != recorded:
            raise TarError(
                f"{name}: the tar header at byte {at} is corrupt (checksum); is it a tar file?"
            )
        length = _number(header[124:136], at, name)
        kind = header[156:157]
        data = at + BLOCK
        if data + length > size:
            what = header[:100].rstrip(b"\0").decode("utf-8", "replace")
            raise TarError(
                f"{name}: truncated: member {what!r} at byte {at} needs {length} bytes, the "
                f"file ends {size - data} bytes after its header."
            )
        if kind in (b"x", b"X"):
            pax = _pax(read(data, length))
        elif kind == b"L":
            long_name = read(data, length).rstrip(b"\0").decode("utf-8", "surrogateescape")
        elif kind in (b"0", b"\0", b"7"):
            path = header[:100].rstrip(b"\0").decode("utf-8", "surrogateescape")
            prefix = header[345:500].rstrip(b"\0").decode("utf-8", "surrogateescape")
            if header[257:262] == b"ustar" and prefix and header[257:263] == b"ustar\0":
                path = f"{prefix}/{path}"
            path = pax.get("path", long_name or path)
            length = int(pax.get("size", length))
            if data + length > size:
                raise TarError(
                    f"{name}: truncated: member {path!r} at byte {at} runs past the end."
                )
            members.append((path, data, length))
            pax, long_name = {}, None
        elif kind != b"g":
            pax, long_name = {}, None
        at = data + -(-length // BLOCK) * BLOCK
    else:  # no end-of-archive blocks: the file stops early
        last = f"after member {members[-1][0]!r} " if members else ""
        raise TarError(
            f"{name}: truncated: it stops {last}at byte {min(at, size)} of {size}, before the "
            "tar end-of-archive marker."
        )
    return _samples(members, name)


def _samples(members: list[tuple[str, int, int]], name: str) -> Index:
    keys: list[str] = []
    rows: list[dict[str, tuple[int, int]]] = []
    for path, offset, length in members:
        folder, _, base = path.rpartition("/")
        stem, dot, ext = base.partition(".")
        if not dot or not ext:
            continue  # no extension: no field
        key = f"{folder}/{stem}" if folder else stem
        if not keys or keys[-1] != key:
            keys.append(key)
            rows.append({})
        if ext in rows[-1]:
            raise TarError(f"{name}: sample {key!r} holds two {ext!r} members.")
        rows[-1][ext] = (offset, length)
    exts = sorted({e for r in rows for e in r})
    offsets = np.full((len(rows), len(exts)), -1, np.int64)
    sizes = np.full((len(rows), len(exts)), -1, np.int64)
    for i, row in enumerate(rows):
        for j, ext in enumerate(exts):
            if ext in row:
                offsets[i, j], sizes[i, j] = row[ext]
    encoded = [k.encode("utf-8", "surrogateescape") for k in keys]
    key_offsets = np.concatenate([[0], np.cumsum([len(k) for k in encoded])]).astype(np.int64)
    meta = {"format": INDEX_FORMAT, "kind": "tar", "samples": len(rows), "fields": exts}
    keys_bytes = np.frombuffer(b"".join(encoded), np.uint8)
    arrays = {"offsets": offsets, "sizes": sizes, "keys": keys_bytes, "key_offsets": key_offsets}
    return Index(meta, arrays)


def _decoder(kind: TarDecoder) -> Callable[[bytes], Any]:
    if callable(kind):
        return kind
    table: dict[str, Callable[[bytes], Any]] = {
        "bytes": lambda b: b,
        "text": lambda b: b.decode("utf-8"),
        "json": json.loads,
        "int": lambda b: int(b.strip() or 0),
        "float": lambda b: float(b.strip() or 0),
        "npy": _npy,
    }
    if kind not in table:
        raise ValueError(
            f"decode={kind!r}: pass one of {sorted(table)} or a function of the bytes."
        )
    return table[kind]


def _npy(data: bytes) -> np.ndarray:
    import io

    return np.load(io.BytesIO(data), allow_pickle=False)


class TarSource:
    """WebDataset tar shards read by index: a sample per key, a field per extension.

    Args:
      shards: paths, globs, brace patterns (``shard-{000..127}.tar``) or URLs of tar files.
      decode: per extension, how to decode its bytes: ``"text"``, ``"json"``, ``"int"``
        and ``"float"`` (numbers: placeable fields), ``"npy"``, ``"bytes"`` (the
        default: bytes objects, to decode in a ``record_transform``) or a function.
      missing: a sample without one of the extensions: ``"error"`` refuses the shards,
        naming the sample; ``"mark"`` gives it an empty value and a boolean field
        ``<ext>_missing`` (True where absent).
      key: the name of the field holding each sample's key (a string), or ``None``.
      index_dir: where the indexes are (default: beside each shard).
      build: build missing or stale indexes now, in this process (else refused: build
        them once with ``meshfeed.index``).
      storage_options, retry_s, cache_dir, cache_bytes: for URLs, as ``open_source``.
    """

    def __init__(
        self,
        shards: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        decode: Mapping[str, TarDecoder] | None = None,
        missing: TarMissing = "error",
        key: str | None = "__key__",
        index_dir: str | os.PathLike[str] | None = None,
        build: bool = False,
        storage_options: Mapping[str, Any] | None = None,
        retry_s: float = RETRY_S,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_bytes: int = CACHE_BYTES,
    ) -> None:
        if missing not in ("error", "mark"):
            raise ValueError(f"missing={missing!r} must be 'error' or 'mark'.")
        decode = dict(decode or {})
        self._decoders = {ext: _decoder(kind) for ext, kind in decode.items()}
        self.files = IndexedFiles(
            shards, kind="tar", scan=scan_tar, index_dir=index_dir, build=build,
            storage_options=storage_options, retry_s=retry_s, cache_dir=cache_dir,
            cache_bytes=cache_bytes,
        )  # fmt: skip
        self._exts = sorted({e for ix in self.files.indexes for e in ix.meta["fields"]})
        unknown = [e for e in decode if e not in self._exts]
        if unknown:
            raise ValueError(
                f"decode names {unknown}, not extensions of the shards ({self._exts})."
            )
        self._columns = [self._column_of(ix) for ix in self.files.indexes]
        self._missing = self._check_missing(missing)
        self._key = key
        fields = {}
        for ext in self._exts:
            kind = decode.get(ext, "bytes")
            dtype = _NUMERIC.get(kind, OBJECT) if isinstance(kind, str) else OBJECT
            fields[ext] = FieldSpec((), dtype)
            if ext in self._missing:
                fields[f"{ext}_missing"] = FieldSpec((), np.dtype(bool))
        if key is not None:
            fields[key] = FieldSpec((), OBJECT)
        self._fields = fields

    def _column_of(self, index: Index) -> dict[str, int]:
        return {ext: j for j, ext in enumerate(index.meta["fields"])}

    def _check_missing(self, rule: str) -> set[str]:
        absent = set()
        for f, (index, columns) in enumerate(zip(self.files.indexes, self._columns, strict=True)):
            for ext in self._exts:
                if ext not in columns:
                    rows = np.arange(index.samples)
                else:
                    rows = np.flatnonzero(index.arrays["offsets"][:, columns[ext]] < 0)
                if len(rows):
                    if rule == "error":
                        raise ValueError(
                            f"{self.files.paths[f]}: sample {self._key_of(f, int(rows[0]))!r} "
                            f"has no {ext!r} member ({len(rows)} samples of this shard lack "
                            "one); pass missing='mark' to read them with an empty value and a "
                            "flag."
                        )
                    absent.add(ext)
        return absent

    def _key_of(self, f: int, row: int) -> str:
        arrays = self.files.indexes[f].arrays
        a, b = arrays["key_offsets"][row], arrays["key_offsets"][row + 1]
        return arrays["keys"][a:b].tobytes().decode("utf-8", "surrogateescape")

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        """One field per extension (bytes unless decoded), the key, and missing flags."""
        return self._fields

    def __len__(self) -> int:
        """The number of samples, over every shard."""
        return len(self.files)

    def _ranges(
        self, file: np.ndarray, local: np.ndarray
    ) -> dict[int, tuple[np.ndarray, np.ndarray, list[tuple[int, str]]]]:
        out = {}
        for f in np.unique(file).tolist():
            rows = np.flatnonzero(file == f)
            arrays, columns = self.files.indexes[f].arrays, self._columns[f]
            starts, ends, where = [], [], []
            for ext, j in columns.items():
                offsets = arrays["offsets"][local[rows], j]
                sizes = arrays["sizes"][local[rows], j]
                there = offsets >= 0
                starts.append(offsets[there])
                ends.append(offsets[there] + sizes[there])
                where += [(int(r), ext) for r in rows[there]]
            order = np.argsort(np.concatenate(starts), kind="stable")
            out[f] = (
                np.concatenate(starts)[order],
                np.concatenate(ends)[order],
                [where[i] for i in order],
            )
        return out

    def __getitem__(self, ids: np.ndarray) -> dict[str, Any]:
        """The samples ``ids``: per field an array with a row per id."""
        file, local = self.files.locate(ids)
        ranges = self._ranges(file, local)
        data = self.files.read({f: (s, e) for f, (s, e, _) in ranges.items()})
        out: dict[str, Any] = {}
        for name, spec in self._fields.items():
            if spec.dtype == OBJECT:
                out[name] = np.empty(len(file), OBJECT)
                if name in self._exts:
                    out[name][:] = [b""] * len(file) if self._decoders.get(name) is None else None
            else:
                out[name] = np.zeros(len(file), spec.dtype)
        for ext in self._missing:
            out[f"{ext}_missing"][:] = True
        for f, (_, _, where) in ranges.items():
            for (row, ext), value in zip(where, data[f], strict=True):
                decode = self._decoders.get(ext)
                out[ext][row] = value if decode is None else decode(value)
                if ext in self._missing:
                    out[f"{ext}_missing"][row] = False
        if self._key is not None:
            out[self._key][:] = [
                self._key_of(int(f), int(r)) for f, r in zip(file, local, strict=True)
            ]
        return out

    def fetches(self, ids: np.ndarray) -> tuple[int, int]:
        """The requests and bytes reading ``ids`` asks a store for."""
        file, local = self.files.locate(ids)
        return self.files.fetches({f: (s, e) for f, (s, e, _) in self._ranges(file, local).items()})

    @property
    def remote(self) -> bool:
        """Whether the shards are behind a URL."""
        return self.files.remote

    @property
    def name(self) -> str:
        """The shards, for messages."""
        return self.files.name

    @property
    def requests(self) -> int:
        """Range requests sent to the store so far."""
        return self.files.requests

    @property
    def bytes_fetched(self) -> int:
        """Bytes received from the store so far."""
        return self.files.bytes_fetched

    @property
    def fingerprint(self) -> dict[str, Any]:
        """What the samples depend on (the loader's state carries it)."""
        return {"tar": self.files.fingerprint(), "missing": sorted(self._missing)}

    def __repr__(self) -> str:
        shards = len(self.files.paths)
        fields = fields_text(self._fields)
        return f"TarSource({self.name!r}, {len(self)} samples in {shards} shards; {fields})"
