"""TFRecord files read by index: ``TFRecordSource``, and ``tf.train.Example`` without TensorFlow.

A TFRecord file is a sequence of records, each framed as an 8-byte little-endian
length, a masked CRC32-C of those 8 bytes, the data, and a masked CRC32-C of the data.
``scan_tfrecord`` reads the 12-byte headers only, checking each length's CRC, and jumps
over the data; a record is then a byte range, read with its data CRC and checked (a
mismatch names the file, the record and its offset). CRC32-C comes from
``google-crc32c`` (the ``formats`` extra); the headers' 8-byte checks fall back to a
table in Python where it is missing.

``parse_example`` reads a serialised ``tf.train.Example`` -- a protocol buffer of named
bytes, float and int64 lists -- straight from the wire format, so TFDS and older Google
data need no TensorFlow to load.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from meshfeed.data._ragged import Ragged
from meshfeed.data._sources import FieldSpec, example_at, fields_text
from meshfeed.formats._index import INDEX_FORMAT, Index, ReadAhead
from meshfeed.formats._indexed import FilesSource, IndexedFiles
from meshfeed.storage._blob import Blob
from meshfeed.storage._cache import CACHE_BYTES
from meshfeed.storage._remote import RETRY_S

OBJECT = np.dtype(object)
FeatureType = str
"""A feature's type with ``decode="example"``: ``"int64"``, ``"float32"``, ``"bytes"`` (one
value each), or ``"ragged:int64"``, ``"ragged:float32"``, ``"bytes_list"`` (any number)."""


class TFRecordError(ValueError):
    """A TFRecord file that is corrupt or truncated."""


def _table() -> list[int]:
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        table.append(crc)
    return table


_TABLE = _table()


def crc32c(data: bytes) -> int:
    """CRC32-C of ``data`` (google-crc32c, or a table in Python for short data)."""
    try:
        import google_crc32c
    except ImportError:
        if len(data) > 64:
            raise ImportError(
                "checking TFRecord CRCs needs google-crc32c: pip install 'meshfeed[formats]' "
                "(from a clone: pip install -e '.[formats]'), or pass check_crc=False."
            ) from None
        crc = 0xFFFFFFFF
        for byte in data:
            crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
        return crc ^ 0xFFFFFFFF
    return int(google_crc32c.value(data))


def masked(crc: int) -> int:
    """TFRecord's masking of a CRC."""
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def scan_tfrecord(blob: Blob) -> Index:
    """The index of one TFRecord file (the module docstring)."""
    with ReadAhead(blob) as reader:
        return _scan(reader, blob.path, reader.size)


def _scan(reader: ReadAhead, name: str, size: int) -> Index:
    buffer, base = b"", 0
    starts, lengths = [], []
    at = 0
    while at < size:
        if not (base <= at and at + 12 <= base + len(buffer)):
            buffer, base = reader.read(at, 12), at
        header = buffer[at - base : at - base + 12]
        if len(header) < 12:
            raise TFRecordError(f"{name}: truncated: a partial record header at byte {at}.")
        length, check = struct.unpack("<QI", header)
        if masked(crc32c(header[:8])) != check:
            raise TFRecordError(
                f"{name}: the record header at byte {at} is corrupt (its length's CRC); is it "
                "a TFRecord file?"
            )
        if at + 12 + length + 4 > size:
            raise TFRecordError(
                f"{name}: truncated: the record at byte {at} holds {length} bytes, the file "
                f"ends {size - at - 12} bytes after its header."
            )
        starts.append(at + 12)
        lengths.append(length)
        at += 12 + length + 4
    meta = {"format": INDEX_FORMAT, "kind": "tfrecord", "samples": len(starts)}
    return Index(
        meta, {"starts": np.asarray(starts, np.int64), "lengths": np.asarray(lengths, np.int64)}
    )


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _fields(data: bytes) -> list[tuple[int, int, Any]]:
    """(field number, wire type, value) of each field of one message."""
    out, at = [], 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(data, at)
        elif wire == 2:
            length, at = _varint(data, at)
            value, at = data[at : at + length], at + length
        elif wire == 5:
            value, at = data[at : at + 4], at + 4
        elif wire == 1:
            value, at = data[at : at + 8], at + 8
        else:
            raise ValueError(
                f"a protocol buffer field of wire type {wire}, which Example does not use"
            )
        out.append((number, wire, value))
    return out


def parse_example(data: bytes) -> dict[str, Any]:
    """A serialised ``tf.train.Example``: feature name -> a list of bytes, or a float32 or
    int64 array, as its ``bytes_list``, ``float_list`` or ``int64_list`` holds it."""
    out: dict[str, Any] = {}
    for number, _, features in _fields(data):
        if number != 1:
            continue
        for entry_number, _, entry in _fields(features):
            if entry_number != 1:
                continue
            key, feature = "", b""
            for n, _, v in _fields(entry):
                if n == 1:
                    key = v.decode()
                elif n == 2:
                    feature = v
            out[key] = _feature(feature)
    return out


def _feature(feature: bytes) -> Any:
    for kind, _, body in _fields(feature):
        values = _fields(body)
        if kind == 1:  # bytes_list
            return [v for n, _, v in values if n == 1]
        if kind == 2:  # float_list: packed, or one fixed32 each
            raw = b"".join(v for n, _, v in values if n == 1)
            return np.frombuffer(raw, "<f4").astype(np.float32)
        if kind == 3:  # int64_list: packed varints, or one varint each
            ints = []
            for n, wire, v in values:
                if n != 1:
                    continue
                if wire == 2:
                    at = 0
                    while at < len(v):
                        x, at = _varint(v, at)
                        ints.append(x)
                else:
                    ints.append(v)
            return np.asarray(ints, np.uint64).astype(np.int64)
    return []


def _type_of(value: Any) -> FeatureType:
    if isinstance(value, list):
        return "bytes" if len(value) == 1 else "bytes_list"
    kind = "int64" if value.dtype == np.int64 else "float32"
    return kind if len(value) == 1 else f"ragged:{kind}"


def _spec(kind: FeatureType, name: str) -> FieldSpec:
    table = {
        "int64": FieldSpec((), np.dtype(np.int64)), "float32": FieldSpec((), np.dtype(np.float32)),
        "bytes": FieldSpec((), OBJECT), "bytes_list": FieldSpec((), OBJECT),
        "ragged:int64": FieldSpec((None,), np.dtype(np.int64)),
        "ragged:float32": FieldSpec((None,), np.dtype(np.float32)),
    }  # fmt: skip
    if kind not in table:
        raise ValueError(f"features: {name!r} has type {kind!r}; pass one of {sorted(table)}.")
    return table[kind]


class TFRecordSource(FilesSource):
    """TFRecord files read by index: each record as bytes, or decoded.

    Args:
      files: paths, globs, brace patterns or URLs of ``.tfrecord`` (``.tfrecords``,
        ``.tfrec``) files, uncompressed.
      decode: ``None``: each record as bytes, the object field ``"record"``;
        ``"example"``: a ``tf.train.Example`` per record, a field per feature (read
        without TensorFlow); or ``fn(bytes) -> dict`` of values.
      features: with ``decode="example"``, the features to read and their types
        (``"int64"``, ``"float32"``, ``"bytes"``: one value each; ``"ragged:int64"``,
        ``"ragged:float32"``, ``"bytes_list"``: any number); default: every feature of
        the first record, one value where it holds one, else a list.
      check_crc: check each record's data CRC as it is read (its header's CRC is checked
        when the file is indexed).
      index_dir, build, storage_options, retry_s, hedge, cache_dir, cache_bytes: as
        ``TarSource``.
    """

    def __init__(
        self,
        files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        decode: str | Callable[[bytes], Mapping[str, Any]] | None = None,
        features: Mapping[str, FeatureType] | None = None,
        check_crc: bool = True,
        index_dir: str | os.PathLike[str] | None = None,
        build: bool = False,
        storage_options: Mapping[str, Any] | None = None,
        retry_s: float = RETRY_S,
        hedge: bool = True,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_bytes: int = CACHE_BYTES,
    ) -> None:
        if decode not in (None, "example") and not callable(decode):
            raise ValueError(f"decode={decode!r}: pass None, 'example' or a function of the bytes.")
        if features is not None and decode != "example":
            raise ValueError("features= types the features of decode='example'; pass both.")
        self.files = IndexedFiles(
            files, kind="tfrecord", scan=scan_tfrecord, index_dir=index_dir, build=build,
            storage_options=storage_options, retry_s=retry_s, hedge=hedge, cache_dir=cache_dir,
            cache_bytes=cache_bytes,
        )  # fmt: skip
        self._check, self._decode = check_crc, decode
        if decode is None:
            self._types: dict[str, FeatureType] = {"record": "bytes"}
        elif decode == "example":
            first = parse_example(self._raw(np.array([0]))[0]) if len(self) else {}
            self._types = (
                dict(features)
                if features is not None
                else {k: _type_of(v) for k, v in first.items()}
            )
        else:
            first = decode(self._raw(np.array([0]))[0])
            self._types = {k: "bytes" for k in first}  # objects, as a function returns them
        self._fields = {n: _spec(k, n) for n, k in self._types.items()}

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        """The record as bytes, or the decoded fields."""
        return self._fields

    def _ranges(
        self, file: np.ndarray, local: np.ndarray
    ) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        out = {}
        for f in np.unique(file).tolist():
            rows = np.flatnonzero(file == f)
            arrays = self.files.index(f).arrays
            starts = arrays["starts"][local[rows]]
            out[f] = (rows, starts, starts + arrays["lengths"][local[rows]] + 4)
        return out

    def _raw(self, ids: np.ndarray) -> list[bytes]:
        file, local = self.files.locate(ids)
        ranges = self._ranges(file, local)
        data = self.files.read({f: (s, e) for f, (_, s, e) in ranges.items()})
        out: list[bytes] = [b""] * len(file)
        for f, (rows, starts, _) in ranges.items():
            for row, raw, start in zip(rows, data[f], starts, strict=True):
                record = raw[:-4]
                if self._check and masked(crc32c(record)) != struct.unpack("<I", raw[-4:])[0]:
                    raise TFRecordError(
                        f"{self.files.paths[f]}: the record at byte {int(start) - 12} does not "
                        "match its CRC: the file is corrupt."
                    )
                out[row] = record
        return out

    def __getitem__(self, ids: np.ndarray | int) -> dict[str, Any]:
        """The records ``ids``: per field an array (or ``Ragged``) with a row per id."""
        if isinstance(ids, int | np.integer):  # source[i]: one example
            return example_at(self, ids)
        raws = self._raw(ids)
        if self._decode is None:
            column = np.empty(len(raws), OBJECT)
            column[:] = raws
            return {"record": column}
        decoded = [parse_example(r) if self._decode == "example" else self._decode(r) for r in raws]  # type: ignore[operator]
        out: dict[str, Any] = {}
        for name, spec in self._fields.items():
            try:
                values = [d[name] for d in decoded]
            except KeyError:
                row = next(i for i, d in enumerate(decoded) if name not in d)
                raise TFRecordError(
                    f"record {int(np.asarray(ids)[row])} of {self.files.name} has no feature "
                    f"{name!r}."
                ) from None
            kind = self._types[name]
            if spec.ragged:
                out[name] = Ragged.from_list(
                    [np.asarray(v, spec.dtype) for v in values], dtype=spec.dtype
                )
            elif spec.dtype == OBJECT:
                column = np.empty(len(values), OBJECT)
                column[:] = [v[0] if kind == "bytes" and isinstance(v, list) else v for v in values]
                out[name] = column
            else:
                if any(len(v) != 1 for v in values):
                    row = next(i for i, v in enumerate(values) if len(v) != 1)
                    raise TFRecordError(
                        f"record {int(np.asarray(ids)[row])} of {self.files.name}: feature "
                        f"{name!r} holds {len(values[row])} values, not one; type it "
                        f"'ragged:{kind}' in features=."
                    )
                out[name] = np.asarray([v[0] for v in values], spec.dtype)
        return out

    def fetches(self, ids: np.ndarray) -> tuple[int, int]:
        """The requests and bytes reading ``ids`` asks a store for."""
        file, local = self.files.locate(ids)
        return self.files.fetches({f: (s, e) for f, (_, s, e) in self._ranges(file, local).items()})

    @property
    def fingerprint(self) -> dict[str, Any]:
        """What the records depend on (the loader's state carries it)."""
        return {"tfrecord": self.files.fingerprint(), "features": self._types}

    def __repr__(self) -> str:
        return f"TFRecordSource({self.name!r}, {len(self)} records; {fields_text(self._fields)})"
