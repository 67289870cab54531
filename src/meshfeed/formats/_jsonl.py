"""JSON Lines files read by index: ``JsonlSource``.

``scan_jsonl`` finds every line's start with a vectorised scan for newlines (numpy over
8 MiB at a time: the scan runs at memory speed, far above any disk), blank lines left
out. A record is then a byte range. Compressed files (``.jsonl.gz``, ``.jsonl.zst``) are
read through their *members*: a gzip file may hold several members one after another,
a zstandard file several frames, each decompressible on its own; the index records each
member's compressed extent and the records' offsets in the decompressed text, and a read
decompresses only the members that hold the records asked for. A file of one large
member (what ``gzip`` and ``zstd`` write by default) could only be read by decompressing
all of it for every record, so it is refused, with the command that rewrites it in
members of 1 MiB of text -- still one valid ``.gz``/``.zst`` stream for every other tool:
``meshfeed index --seekable FILE``. (Restart points inside one deflate stream would need
the decompressor's bit position and its 32 KiB window saved for each; Python's ``zlib``
cannot resume at a bit position, and the windows would make the index a few percent of
the data.)
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from meshfeed.data._nulls import Fill, check_fill, refused, valid_name, with_valid
from meshfeed.data._ragged import Ragged
from meshfeed.data._sources import FieldSpec, example_at, fields_text
from meshfeed.formats._index import INDEX_FORMAT, Index, ReadAhead
from meshfeed.formats._indexed import FilesSource, IndexedFiles
from meshfeed.storage._blob import Blob
from meshfeed.storage._cache import CACHE_BYTES
from meshfeed.storage._compressed import Inflater, compression_of, inflate_member
from meshfeed.storage._remote import RETRY_S

MAX_MEMBER = 16 << 20
"""The largest decompressed member read for one record (16 MiB)."""
SEEKABLE_MEMBER = 1 << 20
"""Text per member when ``meshfeed index --seekable`` rewrites a file (1 MiB)."""
OBJECT = np.dtype(object)
JsonlType = str
"""A JSON Lines field's type: ``"int64"``, ``"float32"``, ... (any numpy number or
``"bool"``), ``"str"`` and ``"object"`` (object arrays), or ``"ragged:<dtype>"`` (a list
of numbers per record, as ``Ragged``)."""


class JsonlError(ValueError):
    """A JSON Lines file that cannot be read as its index says."""


def _lines(chunks: Any, name: str) -> tuple[np.ndarray, np.ndarray, int]:
    """Line starts and lengths (blank lines left out), and the text's size."""
    starts, ends = [np.zeros(1, np.int64)], []
    at = 0
    for chunk in chunks:
        newlines = np.flatnonzero(np.frombuffer(chunk, np.uint8) == 10) + at
        ends.append(newlines)
        starts.append(newlines + 1)
        at += len(chunk)
    start = np.concatenate(starts)
    end = np.concatenate([*ends, [at]]).astype(np.int64)
    length = end - start
    keep = length > 0
    return start[keep], length[keep], at


def scan_jsonl(blob: Blob) -> Index:
    """The index of one JSON Lines file, plain or compressed (the module docstring)."""
    with ReadAhead(blob) as reader:
        return _scan(reader.chunks(), blob.path)


def _scan(chunks: Any, name: str) -> Index:
    kind = compression_of(name)
    inflater = None if kind is None else Inflater(kind, name)
    if inflater is not None:
        chunks = (piece for chunk in chunks for piece in inflater.feed(chunk))
    starts, lengths, total = _lines(chunks, name)
    meta: dict[str, Any] = {
        "format": INDEX_FORMAT,
        "kind": "jsonl",
        "samples": len(starts),
        "compression": kind,
        "text_bytes": total,
    }
    arrays = {"starts": starts, "lengths": lengths.astype(np.int32 if total < 2**31 else np.int64)}
    if inflater is not None:
        inflater.close()
        members = np.array(inflater.members, np.int64).reshape(-1, 4)
        largest = int((members[:, 3] - members[:, 2]).max()) if len(members) else 0
        if largest > MAX_MEMBER and len(starts) > 1:
            raise JsonlError(
                f"{name} holds a {kind} member of {largest / 2**20:.0f} MiB of text: reading "
                "one record would decompress all of it. Rewrite it seekable (members of 1 MiB, "
                f"still one valid {kind} stream for any tool): meshfeed index --seekable {name}"
            )
        arrays["members"] = members
    return Index(meta, arrays)


def _type_of(value: Any) -> JsonlType:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int64"
    if isinstance(value, float):
        return "float64"
    if isinstance(value, str):
        return "str"
    if (
        isinstance(value, list)
        and value
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    ):
        return "ragged:int64" if all(isinstance(v, int) for v in value) else "ragged:float64"
    return "object"


def _spec(kind: JsonlType, name: str) -> FieldSpec:
    if kind in ("str", "object"):
        return FieldSpec((), OBJECT)
    ragged = kind.startswith("ragged:")
    try:
        dtype = np.dtype(kind.removeprefix("ragged:"))
    except TypeError:
        raise ValueError(
            f"fields: {name!r} has type {kind!r}; pass a numpy number type ('int64', "
            "'float32', 'bool'), 'str', 'object' or 'ragged:<type>'."
        ) from None
    return FieldSpec((None,) if ragged else (), dtype)


class _NullError(Exception):
    """A null no value stands for, in the values' row ``row``."""

    def __init__(self, row: int) -> None:
        super().__init__(row)
        self.row = row


def _numbers(
    values: list[Any], spec: FieldSpec, fill: np.generic | None
) -> tuple[np.ndarray | Ragged, np.ndarray | Ragged | None]:
    """A number field's values (a list per record, for a ragged one) and, filled, where
    each record held one; a ``None`` list is an empty document."""
    if spec.ragged:
        documents = [[] if v is None else v for v in values]
        flat = [x for document in documents for x in document]
        lengths = np.fromiter(map(len, documents), np.int64, len(documents))
        offsets = np.zeros(len(documents) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        try:
            numbers, valid = _numbers(flat, FieldSpec((), spec.dtype), fill)
        except _NullError as null:  # a value's row: the record holding it
            raise _NullError(int(np.searchsorted(offsets, null.row, side="right")) - 1) from None
        return Ragged(numbers, offsets), None if valid is None else Ragged(valid, offsets)
    held = np.fromiter((v is not None for v in values), bool, len(values))
    if held.all():
        return np.asarray(values, spec.dtype), None if fill is None else held
    if fill is None and spec.dtype.kind != "f":
        raise _NullError(int(np.flatnonzero(~held)[0]))
    stand_in = np.nan if fill is None else fill
    numbers = np.asarray([v if v is not None else stand_in for v in values], spec.dtype)
    return numbers, None if fill is None else held


class JsonlSource(FilesSource):
    """JSON Lines files read by index: a record per line, chosen fields as typed columns.

    Args:
      files: paths, globs, brace patterns or URLs of ``.jsonl``, ``.jsonl.gz`` and
        ``.jsonl.zst`` files (compressed ones in members: ``meshfeed index --seekable``).
      fields: the fields to read: names (typed from the first record: numbers,
        booleans, strings as objects, lists of numbers as ``Ragged``, anything else as
        objects) or a mapping name -> type (``"int32"``, ``"float32"``, ``"str"``,
        ``"object"``, ``"ragged:int32"``, ...); default: every field of the first record.
      index_dir, build, storage_options, retry_s, hedge, cache_dir, cache_bytes: as
        ``TarSource``.
      fill: ``{field: value}``: a null (or absent) value of these number or boolean
        fields reads as ``value``, with a ``<field>_valid`` field, ``False`` where the
        record held none.

    A ``null`` is never read as a number: a float field reads it as NaN, a filled field
    as its fill, and an integer or boolean field refuses the record (a bad record,
    which ``on_error="skip"`` skips); a ``null`` list is an empty document. A record
    that is not JSON, lacks a field or holds a null it cannot read raises
    ``ValueError`` naming the file and the record's byte offset (in the decompressed
    text, for a compressed file).
    """

    def __init__(
        self,
        files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        fields: Sequence[str] | Mapping[str, JsonlType] | None = None,
        index_dir: str | os.PathLike[str] | None = None,
        build: bool = False,
        storage_options: Mapping[str, Any] | None = None,
        retry_s: float = RETRY_S,
        hedge: bool = True,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_bytes: int = CACHE_BYTES,
        fill: Fill | None = None,
    ) -> None:
        if isinstance(fields, str):
            raise TypeError(f"fields={fields!r} is a string; pass a list of names, e.g. ['text'].")
        self.files = IndexedFiles(
            files,
            kind="jsonl",
            scan=scan_jsonl,
            index_dir=index_dir,
            build=build,
            storage_options=storage_options,
            retry_s=retry_s,
            hedge=hedge,
            cache_dir=cache_dir,
            cache_bytes=cache_bytes,
        )
        if len(self.files) == 0:
            raise ValueError(f"{self.files.name} holds no records.")
        if not isinstance(fields, Mapping):
            first = self._records(np.array([0]))[0]
            names = list(first) if fields is None else list(fields)
            absent = [n for n in names if n not in first]
            if absent:
                raise ValueError(
                    f"fields names {absent}, not fields of the first record ({list(first)})."
                )
            fields = {n: _type_of(first[n]) for n in names}
        self._types = dict(fields)
        self._columns = {n: _spec(k, n) for n, k in self._types.items()}
        self._fill = check_fill(fill, self._columns, what=self.files.name)
        self._fields = with_valid(self._columns, self._fill)

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        """Each chosen field's shape and dtype (``Ragged`` for lists of numbers)."""
        return self._fields

    def _plan(self, file: np.ndarray, local: np.ndarray) -> dict[int, Any]:
        """Per file: the byte ranges to read (records, or the members holding them)."""
        out = {}
        for f in np.unique(file).tolist():
            rows = np.flatnonzero(file == f)
            arrays = self.files.index(f).arrays
            starts = arrays["starts"][local[rows]]
            ends = starts + arrays["lengths"][local[rows]]
            if "members" not in arrays:
                out[f] = (rows, starts, ends, None)
                continue
            members = arrays["members"]
            which = np.searchsorted(members[:, 2], starts, side="right") - 1
            needed = np.unique(which)
            out[f] = (rows, starts, ends, (which, needed, members[needed, 0], members[needed, 1]))
        return out

    def _records(self, ids: np.ndarray) -> list[Any]:
        file, local = self.files.locate(ids)
        plan = self._plan(file, local)
        reads = {
            f: ((p[3][2], p[3][3]) if p[3] is not None else (p[1], p[2])) for f, p in plan.items()
        }
        data = self.files.read(reads)
        out: list[Any] = [None] * len(file)
        for f, (rows, starts, ends, compressed) in plan.items():
            name = self.files.paths[f]
            if compressed is None:
                lines = data[f]
                at = starts
            else:
                which, needed, _, _ = compressed
                kind = self.files.index(f).meta["compression"]
                texts = {
                    int(m): inflate_member(kind, raw, name)
                    for m, raw in zip(needed, data[f], strict=True)
                }
                members = self.files.index(f).arrays["members"]
                lines = [
                    texts[int(m)][s - members[m, 2] : e - members[m, 2]]
                    for m, s, e in zip(which, starts, ends, strict=True)
                ]
                at = starts
            for row, line, offset in zip(rows, lines, at, strict=True):
                try:
                    out[row] = json.loads(line)
                except ValueError as error:
                    where = "byte" if compressed is None else "byte (of the decompressed text)"
                    raise JsonlError(
                        f"{name}, the record at {where} {int(offset)}: not JSON ({error})."
                    ) from None
                if not isinstance(out[row], dict):
                    raise JsonlError(
                        f"{name}, the record at byte {int(offset)}: a JSON "
                        f"{type(out[row]).__name__}, not an object."
                    )
        return out

    def __getitem__(self, ids: np.ndarray | int) -> dict[str, Any]:
        """The records ``ids``: per field an array (or ``Ragged``) with a row per id."""
        if isinstance(ids, int | np.integer):  # source[i]: one example
            return example_at(self, ids)
        ids = np.asarray(ids)
        records = self._records(ids)
        out: dict[str, Any] = {}
        for name, spec in self._columns.items():
            fill = self._fill.get(name)
            if fill is None and any(name not in r for r in records):
                row = next(i for i, r in enumerate(records) if name not in r)
                raise JsonlError(f"{self.origin(int(ids[row]))} has no field {name!r}.")
            values = [r.get(name) for r in records]
            if spec.dtype == OBJECT:
                column = np.empty(len(values), OBJECT)
                column[:] = values
                out[name] = column
                continue
            try:
                out[name], valid = _numbers(values, spec, fill)
            except _NullError as null:
                what = refused(name, spec.dtype, None, "fields=")
                raise JsonlError(f"{self.origin(int(ids[null.row]))}: {what}") from None
            if valid is not None:
                out[valid_name(name)] = valid
        return {name: out[name] for name in self._fields}

    def place(self, f: int, row: int) -> str:
        """``the record at byte N``: where record ``row`` of file ``f`` starts."""
        offset = int(self.files.index(f).arrays["starts"][row])
        compressed = "members" in self.files.index(f).arrays
        where = "byte (of the decompressed text)" if compressed else "byte"
        return f"the record at {where} {offset}"

    def fetches(self, ids: np.ndarray) -> tuple[int, int]:
        """The requests and bytes reading ``ids`` asks a store for."""
        file, local = self.files.locate(ids)
        plan = self._plan(file, local)
        return self.files.fetches(
            {f: ((p[3][2], p[3][3]) if p[3] is not None else (p[1], p[2])) for f, p in plan.items()}
        )

    @property
    def fingerprint(self) -> dict[str, Any]:
        """What the records depend on (the loader's state carries it)."""
        fill = {"fill": {k: v.item() for k, v in self._fill.items()}} if self._fill else {}
        return {"jsonl": self.files.fingerprint(), "fields": self._types, **fill}

    def __repr__(self) -> str:
        return f"JsonlSource({self.name!r}, {len(self)} records; {fields_text(self._fields)})"
