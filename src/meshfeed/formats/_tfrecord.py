r"""TFRecord files read by index: ``TFRecordSource``, and ``tf.train.Example`` without TensorFlow.

A TFRecord file is a sequence of records, each framed as an 8-byte little-endian
length, a masked CRC32-C of those 8 bytes, the data, and a masked CRC32-C of the data.
``scan_tfrecord`` reads the 12-byte headers only, checking each length's CRC, and jumps
over the data; a record is then a byte range, read with its data CRC and checked (a
mismatch names the file, the record and its offset; so does a record that does not
decode, or a feature not of the type asked for). A ``.tfrecord.gz`` file is scanned
and read through its gzip members (``_members``). CRC32-C comes from
``google-crc32c`` (the ``formats`` extra); the headers' 8-byte checks fall back to a
table in Python where it is missing.

Records are ``tf.train.Example``\ s read without TensorFlow (``_example``), or bytes, or
what a function of the bytes makes of them.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from meshfeed.data._ragged import Ragged
from meshfeed.data._sources import FieldSpec, example_at, fields_text
from meshfeed.formats._example import FeatureType, parse_example, spec_of, type_of
from meshfeed.formats._index import INDEX_FORMAT, Index, ReadAhead
from meshfeed.formats._indexed import FilesSource, IndexedFiles
from meshfeed.formats._members import Inflating, scan_file
from meshfeed.storage._blob import Blob
from meshfeed.storage._cache import CACHE_BYTES
from meshfeed.storage._file_errors import named
from meshfeed.storage._remote import RETRY_S

OBJECT = np.dtype(object)


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
    """The index of one TFRecord file, plain or compressed (the module docstring); an
    error names the file."""
    return scan_file(blob, _scan, "record")


def _scan(reader: ReadAhead | Inflating, name: str) -> Index:
    """The frames' headers, from one to the next; ``reader.size`` may be learnt only at
    the end (a decompressed stream)."""
    buffer, base = b"", 0
    starts, lengths = [], []
    at = 0
    while at < reader.size:
        if not (base <= at and at + 12 <= base + len(buffer)):
            buffer, base = reader.read(at, 12), at
        header = buffer[at - base : at - base + 12]
        if not header and at >= reader.size:
            break  # a decompressed stream's end, found by this read
        if len(header) < 12:
            raise TFRecordError(f"{name}: truncated: a partial record header at byte {at}.")
        length, check = struct.unpack("<QI", header)
        if masked(crc32c(header[:8])) != check:
            raise TFRecordError(
                f"{name}: the record header at byte {at} is corrupt (its length's CRC); is it "
                "a TFRecord file?"
            )
        if at + 12 + length + 4 > reader.size:
            _truncated(name, at, length, reader.size)
        starts.append(at + 12)
        lengths.append(length)
        at += 12 + length + 4
    if at > reader.size:  # a decompressed stream's last record runs past its end
        _truncated(name, starts[-1] - 12, lengths[-1], reader.size)
    meta = {"format": INDEX_FORMAT, "kind": "tfrecord", "samples": len(starts)}
    return Index(
        meta, {"starts": np.asarray(starts, np.int64), "lengths": np.asarray(lengths, np.int64)}
    )


def _truncated(name: str, at: int, length: int, size: int) -> None:
    raise TFRecordError(
        f"{name}: truncated: the record at byte {at} holds {length} bytes, the file ends "
        f"{size - at - 12} bytes after its header."
    )


class TFRecordSource(FilesSource):
    """TFRecord files read by index: each record as bytes, or decoded.

    Args:
      files: paths, globs, brace patterns or URLs of ``.tfrecord`` (``.tfrecords``,
        ``.tfrec``) files, or of ``.tfrecord.gz`` files in gzip members (what
        ``meshfeed index --seekable`` makes of TensorFlow's ``GZIP`` files).
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
            files,
            kind="tfrecord",
            scan=scan_tfrecord,
            index_dir=index_dir,
            build=build,
            storage_options=storage_options,
            retry_s=retry_s,
            hedge=hedge,
            cache_dir=cache_dir,
            cache_bytes=cache_bytes,
        )
        self._check = check_crc
        self._decode = decode
        if decode is None:
            self._types: dict[str, FeatureType] = {"record": "bytes"}
        elif features is not None:
            self._types = dict(features)
        elif decode == "example":  # typed from the first record
            first = self._decoded(np.array([0]))[0][0] if len(self) else {}
            self._types = {k: type_of(v) for k, v in first.items()}
        else:
            first = self._decoded(np.array([0]))[0][0]
            self._types = {k: "bytes" for k in first}  # objects, as a function returns them
        self._fields = {n: spec_of(k, n) for n, k in self._types.items()}

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

    def _raw(self, ids: np.ndarray) -> tuple[list[bytes], list[tuple[str, int]]]:
        """The records ``ids`` (their CRCs checked), and where each lies: its file and
        its frame's byte offset (in the decompressed stream, for a compressed file)."""
        file, local = self.files.locate(ids)
        ranges = self._ranges(file, local)
        data = self.files.read_spans({f: (s, e) for f, (_, s, e) in ranges.items()})
        out: list[bytes] = [b""] * len(file)
        places: list[tuple[str, int]] = [("", 0)] * len(file)
        for f, (rows, starts, _) in ranges.items():
            path = self.files.paths[f]
            for row, raw, start in zip(rows.tolist(), data[f], starts.tolist(), strict=True):
                record, places[row] = raw[:-4], (path, start - 12)
                if self._check and masked(crc32c(record)) != struct.unpack("<I", raw[-4:])[0]:
                    raise TFRecordError(
                        f"{path}: the record at byte {start - 12} does not match its CRC: the "
                        "file is corrupt."
                    )
                out[row] = record
        return out, places

    def _decoded(self, ids: np.ndarray) -> tuple[list[Mapping[str, Any]], list[tuple[str, int]]]:
        """``_raw``, each record decoded; a record that does not decode is named."""
        raws, places = self._raw(ids)
        decode = parse_example if self._decode == "example" else self._decode
        assert callable(decode)
        out = []
        for raw, (path, at) in zip(raws, places, strict=True):
            with named(path, f"the record at byte {at}"):
                out.append(decode(raw))
        return out, places

    def __getitem__(self, ids: np.ndarray | int) -> dict[str, Any]:
        """The records ``ids``: per field an array (or ``Ragged``) with a row per id."""
        if isinstance(ids, int | np.integer):  # source[i]: one example
            return example_at(self, ids)
        if self._decode is None:
            raws, _ = self._raw(ids)
            return {"record": _objects(raws)}
        decoded, places = self._decoded(ids)
        out: dict[str, Any] = {}
        for name, spec in self._fields.items():
            values = []
            for d, (path, at) in zip(decoded, places, strict=True):
                if name not in d:
                    raise TFRecordError(f"{path}, the record at byte {at}: no feature {name!r}.")
                values.append(d[name])
            if callable(self._decode):  # a function's values, as it returns them
                out[name] = _objects(values)
                continue
            kind = self._types[name]
            for v, (path, at) in zip(values, places, strict=True):
                _check_feature(v, kind, name, path, at)
            if spec.ragged:
                out[name] = Ragged.from_list(
                    [np.asarray(v, spec.dtype) for v in values], dtype=spec.dtype
                )
            elif kind == "bytes_list":
                out[name] = _objects(values)
            elif kind == "bytes":
                out[name] = _objects([v[0] for v in values])
            else:
                out[name] = np.asarray([v[0] for v in values], spec.dtype)
        return out

    def place(self, f: int, row: int) -> str:
        """``the record at byte N``: where record ``row`` of file ``f``'s frame starts."""
        return f"the record at byte {int(self.files.index(f).arrays['starts'][row]) - 12}"

    def fetches(self, ids: np.ndarray) -> tuple[int, int]:
        """The requests and bytes reading ``ids`` asks a store for."""
        file, local = self.files.locate(ids)
        ranges = self._ranges(file, local)
        return self.files.span_fetches({f: (s, e) for f, (_, s, e) in ranges.items()})

    @property
    def fingerprint(self) -> dict[str, Any]:
        """What the records depend on (the loader's state carries it)."""
        return {"tfrecord": self.files.fingerprint(), "features": self._types}

    def __repr__(self) -> str:
        return f"TFRecordSource({self.name!r}, {len(self)} records; {fields_text(self._fields)})"


def _objects(values: list[Any]) -> np.ndarray:
    """``values`` as an object array, one element each (lists stay lists)."""
    column = np.empty(len(values), OBJECT)
    for i, value in enumerate(values):
        column[i] = value
    return column


def _check_feature(value: Any, kind: FeatureType, name: str, path: str, at: int) -> None:
    """Refuses a feature whose values are not of its type, or not one where it is typed
    as one value: a value the record does not hold never reaches a batch."""
    want = kind.removeprefix("ragged:").removesuffix("_list")
    held = str(value.dtype) if isinstance(value, np.ndarray) else "bytes" if value else want
    if held != want:  # (a feature with no list at all holds no values: any type)
        raise TFRecordError(
            f"{path}, the record at byte {at}: feature {name!r} holds {held} values, but "
            f"features= types it {kind!r}."
        )
    if kind in ("int64", "float32", "bytes") and len(value) != 1:
        other = "bytes_list" if kind == "bytes" else f"ragged:{kind}"
        raise TFRecordError(
            f"{path}, the record at byte {at}: feature {name!r} holds {len(value)} values, not "
            f"one; type it {other!r} in features=."
        )
