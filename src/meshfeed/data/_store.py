"""meshfeed's own folder format, read: ``open_source``.

::

    data/
      meshfeed.json               # lengths, fields (shape, dtype), shards, checksums
      image/00000.npy             # rows 0 .. shard_size-1 of field "image"
      image/00001.npy
      tokens/00000.values.npy     # a ragged field: its documents' values, one after another
      tokens/00000.offsets.npy    # and where each document starts (N + 1 offsets)
      ...

Plain ``.npy`` files, so any tool reads them (``_writer`` writes them). ``open_source``
opens the folder -- or a folder of parts written by separate workers, or a single
``.npy``/``.npz`` -- as one ``Source`` over all shards and reads each step's rows by
byte range (``pread`` locally, ``cat_ranges`` through fsspec for URLs), so a process
reads its own rows and nothing else, and never downloads a shard whole.

The manifest is the folder's *catalog*: with each file's rows, where its rows start,
its size and SHA-256 (behind a URL, its ETag), it is all a host reads to start -- one
request, whatever the shard count (two for a folder made by ``prepare``, whose record
holds the catalog over its parts). Each file is checked at its first read on a host
(size, header; ETag behind a URL: ``Blob.expect``), not before, and still refused by
name if it changed. A folder written before catalogs (or parts with none over them)
opens as it did -- every shard's header and size asked for on open, a few requests a
shard -- and says so once, naming ``meshfeed index``, which writes its catalog.
``verify=True`` reads every byte once on open and checks it against the SHA-256.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from meshfeed.data._files import NpyRows, RaggedRows, npz_members
from meshfeed.data._folder import (
    MANIFEST,
    RECORD,
    check_prepared,
    join,
    listing,
    not_a_folder,
    part_folder,
    read_json,
)
from meshfeed.data._manifest import cataloged_npy, checked_npy, read_manifest, valid_manifest
from meshfeed.data._sharded import Rows, ShardedSource
from meshfeed.data._sources import (
    FieldSpec,
    field_text,
)
from meshfeed.data._tokenizer import TokenizerArg
from meshfeed.storage._blob import Blob, is_url, require_fsspec
from meshfeed.storage._cache import CACHE_BYTES, ShardCache
from meshfeed.storage._file_errors import named
from meshfeed.storage._handles import limit_open_files
from meshfeed.storage._remote import RETRY_S

_PART = re.compile(r"part-(\d{5})-of-(\d{5})$")
_SAID: set[str] = set()  # folders said to open without a catalog, in this process


def open_source(
    path: str | os.PathLike[str],
    *,
    verify: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    retry_s: float = RETRY_S,
    hedge: bool = True,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_bytes: int = CACHE_BYTES,
    tokenizer: TokenizerArg | None = None,
    max_open_files: int | None = None,
) -> ShardedSource:
    """Opens a meshfeed folder (one with ``meshfeed.json``, or one of parts), a ``.npy``
    or a ``.npz``.

    Args:
      path: a local path or an fsspec URL (``file://``, ``memory://``, ``s3://``, ...).
      verify: also read every shard whole once and check its SHA-256 against the
        manifest (after copying a dataset, say). Headers and sizes are always checked.
      storage_options: for a URL, the filesystem's options (``endpoint_url``, ``key``,
        ``secret``, ``anon``, ...), as fsspec, pandas and Hugging Face datasets take them.
      retry_s: for a URL, how long the store may fail or be unreachable with no
        success in between before every read of it raises (one clock per store and
        process, shared by every read; the reads wait with backoff meanwhile); a
        missing object or denied access raises at once.
      hedge: for a URL, a range read far slower than the store usually answers (twice
        its recent p95, at least 50 ms) gets one duplicate request, the first answer
        winning, within 5% of the requests sent (``False``: never).
      cache_dir: for a URL, a local directory to keep whole shard files in once read,
        so later epochs read the disk instead of the store (``None``: no cache; every
        read is a range request). Processes on one machine may share it.
      cache_bytes: the most bytes ``cache_dir`` holds (16 GiB by default); the least
        recently used files are deleted to make room, and a file larger than this is
        read by range instead.
      tokenizer: for a folder made by ``meshfeed.prepare``, the tokenizer the reader
        will use (a ``tokenizers.Tokenizer``, a ``tokenizer.json`` path or a
        ``TokenizerFunction``): its content hash, fingerprint, vocabulary and special
        tokens are compared with the folder's record, and a mismatch is refused, naming
        what differs. A prepared folder whose build is unfinished is always refused.

      max_open_files: the most files this process keeps open at once (default 128;
        never more than half the soft ``RLIMIT_NOFILE``), the least recently read closed
        first: one bound for the whole process, every source's files together, set by
        the last source opened with it. Past it, small files (64 KiB at most) are held
        whole by their bytes instead, within 64 MiB a process.

    Returns:
      A ``ShardedSource`` reading only the rows asked for.
    """
    root = os.fspath(path)
    limit_open_files(max_open_files)
    cache = None
    if cache_dir is not None:
        if not is_url(root):
            raise ValueError(
                f"cache_dir keeps copies of files behind a URL, but {root} is a local path "
                "already; drop cache_dir."
            )
        cache = ShardCache(cache_dir, cache_bytes)
    blob = functools.partial(
        Blob, storage_options=storage_options, retry_s=retry_s, cache=cache, hedge=hedge
    )
    if root.endswith(".npy"):
        rows = NpyRows(blob(root))
        rows.check_size()
        field = os.path.basename(root.rstrip("/")).removesuffix(".npy")
        return ShardedSource([{field: rows}], name=root)
    if root.endswith(".npz"):
        members = npz_members(blob(root))
        if not members:
            raise ValueError(f"{root} holds no arrays.")
        for member in members.values():
            member.check_size()
        lengths = {k: m.rows for k, m in members.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"{root} holds arrays of different lengths {lengths}.")
        return ShardedSource(list([members]), name=root)  # type: ignore[list-item]
    try:
        manifest = read_json(join(root, MANIFEST), storage_options)  # one request
    except NotADirectoryError:  # a local file, not a folder
        raise ValueError(
            not_a_folder(root)
            or f"{root} is a file, not a meshfeed folder: open_source opens a folder with "
            f"{MANIFEST} (written by meshfeed.write_source or meshfeed.prepare), a .npy or a .npz."
        ) from None
    if manifest is None and not_a_folder(root) is not None:  # a file by its suffix
        raise ValueError(not_a_folder(root))
    if manifest is not None:  # a folder (its manifest is its catalog)
        if tokenizer is not None:  # refused: not made by prepare
            check_prepared(root, tokenizer=tokenizer, storage_options=storage_options)
        manifest = valid_manifest(manifest, join(root, MANIFEST))
        if not manifest["shards"]:
            raise ValueError(f"{join(root, MANIFEST)} lists no examples.")
        shards = _shards(root, manifest, blob, verify=verify, where=join(root, MANIFEST))
        return _from_catalog(ShardedSource(shards, name=root), root, manifest, storage_options)
    record = read_json(join(root, RECORD), storage_options)  # a prepared folder: one more
    check_prepared(root, tokenizer=tokenizer, storage_options=storage_options, record=record)
    if record is not None and record.get("catalog"):
        catalog = valid_manifest(record["catalog"], join(root, RECORD))
        shards = _shards(root, catalog, blob, verify=verify, where=join(root, RECORD))
        return _from_catalog(ShardedSource(shards, name=root), root, catalog, storage_options)
    parts = part_folders(root, storage_options)
    if not parts:
        names = listing(root, storage_options)
        hint = None if names is None else not_a_folder(root, names)
        if hint is not None:  # a folder of files other sources read
            raise ValueError(hint)
        read_manifest(root, blob)  # raises: no manifest
    no_catalog(root, f"{len(parts)} parts, none over them")
    shards: list[dict[str, Rows]] = []
    fields: Any = None
    for folder in parts:
        manifest = read_manifest(join(root, folder), blob)
        if not manifest["num_examples"]:
            continue  # a part of a build that kept no documents
        if fields is not None and manifest["fields"] != fields:
            raise ValueError(
                f"{join(root, folder)} has fields {manifest['fields']}, {parts[0]} has "
                f"{fields}: the parts were written from different data."
            )
        fields = manifest["fields"]
        shards += _shards(
            join(root, folder),
            manifest,
            blob,
            verify=verify,
            said=True,
            where=join(root, folder, MANIFEST),
        )
    if not shards:
        raise ValueError(f"{root} holds {len(parts)} parts and no examples in any of them.")
    return ShardedSource(shards, name=root)


def _from_catalog(
    source: ShardedSource,
    root: str,
    catalog: Mapping[str, Any],
    storage_options: Mapping[str, Any] | None,
) -> ShardedSource:
    """``source``, knowing where it came from and which catalog it was read from (what a
    stored packing plan is kept beside and checked against)."""
    source.origin = (root, storage_options)
    text = json.dumps(catalog["shards"], sort_keys=True).encode()
    source.catalog_digest = hashlib.sha256(text).hexdigest()[:16]
    source.classes = catalog.get("images", {}).get("classes")
    return source


def no_catalog(where: str, what: str, names: str | None = None) -> None:
    """Says once per process that data opens without a catalog, and the command that
    writes one (``names``: what to give it; default ``where``)."""
    if where in _SAID:
        return
    _SAID.add(where)
    sys.stderr.write(
        f"meshfeed: {where} has no catalog ({what}): each host asks the store about every "
        f"file before reading; write one once with `meshfeed index {names or where}`\n"
    )
    sys.stderr.flush()


def part_folders(root: str, storage_options: Mapping[str, Any] | None) -> list[str]:
    """The part folders under ``root`` in order, when it holds parts and no manifest."""
    if is_url(root):
        fs, inner = require_fsspec().core.url_to_fs(root, **dict(storage_options or {}))
        if fs.exists(f"{inner.rstrip('/')}/{MANIFEST}"):
            return []
    elif os.path.exists(os.path.join(root, MANIFEST)):
        return []
    names = listing(root, storage_options)
    if names is None:
        return []
    found = {int(m.group(1)): int(m.group(2)) for n in names if (m := _PART.match(n))}
    if not found:
        return []
    counts = set(found.values())
    if len(counts) > 1:
        raise ValueError(f"{root} holds parts of different counts {sorted(counts)}; keep one set.")
    count = counts.pop()
    missing = [i for i in range(count) if i not in found]
    if missing:
        raise FileNotFoundError(
            f"{root} holds {len(found)} of {count} parts; parts {missing} are missing (their "
            "writers have not finished, or failed): write them, then open the dataset."
        )
    return [part_folder(i, count) for i in range(count)]


def _shards(
    root: str,
    manifest: dict[str, Any],
    blob: Callable[[str], Blob],
    *,
    verify: bool,
    where: str,
    said: bool = False,
) -> list[dict[str, Rows]]:
    """Each shard's files as ``where`` (the manifest, or a record holding the catalog)
    lists them; an entry it cannot be read as is named, by ``where`` and its place."""
    shards: list[dict[str, Rows]] = []
    for i, entry in enumerate(manifest["shards"]):
        with named(where, f"its shard {i}"):
            shard, said = _shard(root, manifest, entry, blob, verify=verify, said=said)
        shards.append(shard)
    return shards


def _shard(
    root: str,
    manifest: dict[str, Any],
    entry: dict[str, Any],
    blob: Callable[[str], Blob],
    *,
    verify: bool,
    said: bool,
) -> tuple[dict[str, Rows], bool]:
    """One shard's files, by field; and whether the folder was said to have no catalog."""
    shard: dict[str, Rows] = {}
    for name, spec in manifest["fields"].items():
        info = entry["files"].get(name)
        if info is None:
            raise ValueError(f"{join(root, MANIFEST)} lists a shard without field {name!r}.")
        want = FieldSpec(tuple(spec["shape"]), np.dtype(spec["dtype"]))
        first = info["values"] if want.ragged else info
        if "offset" in first and not verify:  # a catalog: nothing to ask before a read
            rows: Rows
            if want.ragged:
                offsets = {**info["offsets"], "rows": entry["rows"] + 1}  # int64 (Ragged)
                rows = RaggedRows(
                    cataloged_npy(root, info["values"], want.shape[1:], want.dtype, blob),
                    cataloged_npy(root, offsets, (), np.dtype(np.int64), blob),
                )
            else:
                rows = cataloged_npy(root, info, want.shape, want.dtype, blob)
            shard[name] = rows
            continue
        if "offset" not in first and not said:
            no_catalog(root, "its manifest is from before catalogs")
            said = True
        if want.ragged:
            values_path = join(root, info["values"]["path"])
            with named(values_path, "its .npy header"):
                values = NpyRows(blob(values_path))
            rows = RaggedRows(
                checked_npy(root, info["values"], values.rows, blob, verify=verify),
                checked_npy(root, info["offsets"], entry["rows"] + 1, blob, verify=verify),
            )
        else:
            rows = checked_npy(root, info, entry["rows"], blob, verify=verify)
        got = FieldSpec(rows.row_shape, rows.dtype)
        if got != want:
            raise ValueError(
                f"{rows.name} holds {field_text(got)} rows but the manifest says "
                f"{field_text(want)}: shards of field {name!r} disagree; rewrite the dataset."
            )
        shard[name] = rows
    return shard, said
