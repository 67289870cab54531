"""WebDataset tar shards, read by index: ``TarSource``.

A WebDataset shard is a plain tar file whose members are grouped into samples by *key*:
``000123.jpg``, ``000123.json`` and ``000123.cls`` are the ``jpg``, ``json`` and ``cls``
fields of sample ``000123``. ``TarSource`` reads the members a step needs by byte range,
as the shard's index (``_tar_scan``) locates them, and decodes what it is asked to. A
compressed shard's members are read as the gzip members (zstandard frames) that hold
them, and only those are decompressed (``_members``). A member that does not decode is
named: the shard, the sample's key, the extension.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from meshfeed.core._npy import load_npy
from meshfeed.data._sources import FieldSpec, example_at, fields_text
from meshfeed.formats._indexed import FilesSource, IndexedFiles
from meshfeed.formats._tar_scan import scan_tar
from meshfeed.storage._cache import CACHE_BYTES
from meshfeed.storage._file_errors import named
from meshfeed.storage._remote import RETRY_S

OBJECT = np.dtype(object)
TarMissing = Literal["error", "mark"]
"""What ``TarSource`` does with a sample that lacks one of the shards' extensions: refuse
the shards (naming it), or give an empty value and a ``<ext>_missing`` flag."""
TarDecoder = str | Callable[[bytes], Any]
"""A member's decoding: ``"bytes"`` (as is), ``"text"``, ``"json"``, ``"int"``,
``"float"``, ``"npy"``, or a function of the bytes."""
_NUMERIC = {"int": np.dtype(np.int64), "float": np.dtype(np.float64)}


def _decoder(kind: TarDecoder) -> Callable[[bytes], Any]:
    if callable(kind):
        return kind
    table: dict[str, Callable[[bytes], Any]] = {
        "bytes": lambda b: b,
        "text": lambda b: b.decode("utf-8"),
        "json": json.loads,
        "int": lambda b: int(b.strip() or 0),
        "float": lambda b: float(b.strip() or 0),
        "npy": load_npy,
    }
    if kind not in table:
        raise ValueError(
            f"decode={kind!r}: pass one of {sorted(table)} or a function of the bytes."
        )
    return table[kind]


class TarSource(FilesSource):
    """WebDataset tar shards read by index: a sample per key, a field per extension.

    Args:
      shards: paths, globs, brace patterns (``shard-{000..127}.tar``) or URLs of tar files,
        plain or compressed in members (``.tgz``, ``.tar.gz``, ``.tar.zst``; a shard of
        one large member, as ``tar czf`` writes it, is refused with the command that
        rewrites it in members: ``meshfeed index --seekable``).
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
      storage_options, retry_s, hedge, cache_dir, cache_bytes: for URLs, as ``open_source``.
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
        hedge: bool = True,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_bytes: int = CACHE_BYTES,
    ) -> None:
        if missing not in ("error", "mark"):
            raise ValueError(f"missing={missing!r} must be 'error' or 'mark'.")
        decode = dict(decode or {})
        self._decoders = {ext: _decoder(kind) for ext, kind in decode.items()}
        self.files = IndexedFiles(
            shards,
            kind="tar",
            scan=scan_tar,
            index_dir=index_dir,
            build=build,
            storage_options=storage_options,
            retry_s=retry_s,
            hedge=hedge,
            cache_dir=cache_dir,
            cache_bytes=cache_bytes,
        )
        self._exts = sorted({e for meta in self.files.metas for e in meta["fields"]})
        unknown = [e for e in decode if e not in self._exts]
        if unknown:
            raise ValueError(
                f"decode names {unknown}, not extensions of the shards ({self._exts})."
            )
        self._columns = [self._column_of(meta) for meta in self.files.metas]
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

    def _column_of(self, meta: Mapping[str, Any]) -> dict[str, int]:
        return {ext: j for j, ext in enumerate(meta["fields"])}

    def _check_missing(self, rule: str) -> set[str]:
        absent = set()
        for f, (meta, columns) in enumerate(zip(self.files.metas, self._columns, strict=True)):
            for ext in self._exts:
                lacking = self._lacking(f, meta, columns, ext)
                if not lacking:
                    continue
                if rule == "error":
                    arrays = self.files.index(f).arrays
                    rows = np.flatnonzero(
                        arrays["offsets"][:, columns[ext]] < 0
                        if ext in columns
                        else np.ones(int(meta["samples"]), bool)
                    )
                    raise ValueError(
                        f"{self.files.paths[f]}: sample {self._key_of(f, int(rows[0]))!r} "
                        f"has no {ext!r} member ({lacking} samples of this shard lack "
                        "one); pass missing='mark' to read them with an empty value and a "
                        "flag."
                    )
                absent.add(ext)
        return absent

    def _lacking(self, f: int, meta: Mapping[str, Any], columns: dict[str, int], ext: str) -> int:
        """How many samples of file ``f`` have no ``ext`` member (from the catalog's count,
        else from the index)."""
        if ext not in columns:
            return int(meta["samples"])
        if "missing" in meta:
            return int(meta["missing"].get(ext, 0))
        return int((self.files.index(f).arrays["offsets"][:, columns[ext]] < 0).sum())

    def place(self, f: int, row: int) -> str:
        """``sample '<key>'``: where sample ``row`` of shard ``f`` is, by its key."""
        return f"sample {self._key_of(f, row)!r}"

    def _key_of(self, f: int, row: int) -> str:
        arrays = self.files.index(f).arrays
        a, b = arrays["key_offsets"][row], arrays["key_offsets"][row + 1]
        return arrays["keys"][a:b].tobytes().decode("utf-8", "surrogateescape")

    def _member_text(self, f: int, row: int, ext: str) -> str:
        """``sample '<key>', its '<ext>' member``, for messages."""
        return f"sample {self._key_of(f, row)!r}, its {ext!r} member"

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        """One field per extension (bytes unless decoded), the key, and missing flags."""
        return self._fields

    def _ranges(
        self, file: np.ndarray, local: np.ndarray
    ) -> dict[int, tuple[np.ndarray, np.ndarray, list[tuple[int, str]]]]:
        out = {}
        for f in np.unique(file).tolist():
            rows = np.flatnonzero(file == f)
            arrays, columns = self.files.index(f).arrays, self._columns[f]
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

    def __getitem__(self, ids: np.ndarray | int) -> dict[str, Any]:
        """The samples ``ids``: per field an array with a row per id."""
        if isinstance(ids, int | np.integer):  # source[i]: one example
            return example_at(self, ids)
        file, local = self.files.locate(ids)
        ranges = self._ranges(file, local)
        data = self.files.read_spans({f: (s, e) for f, (s, e, _) in ranges.items()})
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
                try:
                    out[ext][row] = value if decode is None else decode(value)
                except Exception:  # named: the shard, the sample and its member
                    with named(self.files.paths[f], self._member_text(f, int(local[row]), ext)):
                        raise
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
        ranges = self._ranges(file, local)
        return self.files.span_fetches({f: (s, e) for f, (s, e, _) in ranges.items()})

    @property
    def fingerprint(self) -> dict[str, Any]:
        """What the samples depend on (the loader's state carries it)."""
        return {"tar": self.files.fingerprint(), "missing": sorted(self._missing)}

    def __repr__(self) -> str:
        shards = len(self.files.paths)
        fields = fields_text(self._fields)
        return f"TarSource({self.name!r}, {len(self)} samples in {shards} shards; {fields})"
