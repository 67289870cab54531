"""Catalogs: the one object a host reads to start, whatever the number of files.

A pod of 4,096 hosts opening a dataset of 10^5 shards at once used to send every shard a
HEAD and two header reads from every host: ~2.5 x 10^9 requests before the first step,
against a store that serves a few thousand a second. A *catalog* holds what a host
needs before its first data read -- every file's rows, where its rows start, its size
and its version -- so a host reads one object to start, and each file is checked at its
first read instead (``Blob.expect``), still refused by name if it changed.

For a meshfeed folder the catalog is its manifest (``write_source`` writes one), or, for
a folder made by ``prepare``, the record's ``catalog`` (every part's manifest as one).
A set of indexed files (WebDataset tar, JSON Lines, TFRecord, Parquet) has
``meshfeed.catalog.json`` beside them (or in their ``index_dir``), written by
``meshfeed.index``: every file's path, stamp and index summary (samples, fields; for
Parquet its row groups and schema). This module writes catalogs, upgrades folders
written before them, and finds the catalog of a set of files from their patterns alone,
with no listing of the store.
"""

from __future__ import annotations

import fnmatch
import json
import os
import posixpath
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from meshfeed.data._files import NpyRows
from meshfeed.data._folder import MANIFEST, RECORD, join, part_folder, read_json
from meshfeed.data._store import part_folders
from meshfeed.data._writer import FolderWriter
from meshfeed.storage._blob import Blob, is_url, require_fsspec
from meshfeed.storage._paths import expand_braces

CATALOG = "meshfeed.catalog.json"
CATALOG_FORMAT = "meshfeed.catalog/1"
MIXED = "mixed"  # the kind of a catalog over files of several kinds (each entry says its own)
_GLOB = set("*?[")


def merge_manifests(parts: Sequence[tuple[str, dict[str, Any] | None]]) -> dict[str, Any] | None:
    """The manifests of a folder's parts (``(folder, manifest)`` in order) as one, each
    file's path under its part's folder; ``None`` when a part has none or no catalog."""
    merged: dict[str, Any] | None = None
    for folder, manifest in parts:
        if manifest is None:
            return None
        if not manifest["num_examples"]:
            continue  # a part that kept no documents
        if merged is None:
            merged = {k: v for k, v in manifest.items() if k not in ("shards", "num_examples")}
            merged.update(num_examples=0, shards=[])
        elif manifest["fields"] != merged["fields"]:
            raise ValueError(
                f"part {folder} has fields {manifest['fields']}, the parts before it "
                f"{merged['fields']}: the parts were written from different data."
            )
        for entry in manifest["shards"]:
            if not _cataloged(entry):
                return None
            merged["shards"].append({**entry, "files": _under(folder, entry["files"])})
        merged["num_examples"] += manifest["num_examples"]
    return merged


def _under(folder: str, files: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, info in files.items():
        if "path" in info:
            out[name] = {**info, "path": f"{folder}/{info['path']}"}
        else:  # a ragged field: values and offsets
            out[name] = {k: {**v, "path": f"{folder}/{v['path']}"} for k, v in info.items()}
    return out


def _cataloged(entry: Mapping[str, Any]) -> bool:
    first = next(iter(entry["files"].values()))
    return "offset" in first.get("values", first)


def write_catalog(
    root: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None
) -> str:
    """Writes the catalog of a meshfeed folder written before catalogs, or of its parts
    (every shard's header read once, here); returns where it is now."""
    root = os.fspath(root)
    writer = FolderWriter(root, storage_options)
    manifest = read_json(join(root, MANIFEST), storage_options)
    if manifest is not None:
        writer.write(MANIFEST, _dump(_upgraded(root, manifest, writer)))
        return join(root, MANIFEST)
    record = read_json(join(root, RECORD), storage_options)
    if record is not None:
        if record.get("complete") is None:
            raise ValueError(f"{root} is an unfinished prepare build; finish it first.")
        count = len(record["plan"]["parts"])
        folders = [part_folder(i, count) for i in range(count)]
    else:
        folders = _part_folders(root, storage_options)
    parts = []
    for folder in folders:
        part = read_json(join(root, folder, MANIFEST), storage_options)
        if part is None:
            raise FileNotFoundError(f"{join(root, folder, MANIFEST)} does not exist.")
        parts.append((folder, _upgraded(join(root, folder), part, writer, under=folder)))
    catalog = merge_manifests(parts)
    if record is not None:
        writer.write(RECORD, _dump({**record, "catalog": catalog}))
        return join(root, RECORD)
    writer.write(MANIFEST, _dump(catalog))
    return join(root, MANIFEST)


def _part_folders(root: str, storage_options: Mapping[str, Any] | None) -> list[str]:
    folders = part_folders(root, storage_options)
    if not folders:
        raise FileNotFoundError(f"{root} is not a meshfeed folder (no {MANIFEST}, no parts).")
    return folders


def _upgraded(
    root: str, manifest: dict[str, Any], writer: FolderWriter, under: str = ""
) -> dict[str, Any]:
    """``manifest`` with every file's rows, offset (and ETag behind a URL) read from it."""
    shards = []
    for entry in manifest["shards"]:
        files: dict[str, Any] = {}
        for name, info in entry["files"].items():
            if "path" in info:
                files[name] = _file(root, info, writer, under)
            else:
                files[name] = {k: _file(root, v, writer, under) for k, v in info.items()}
        shards.append({**entry, "files": files})
    return {**manifest, "shards": shards}


def _file(root: str, info: dict[str, Any], writer: FolderWriter, under: str) -> dict[str, Any]:
    npy = NpyRows(Blob(join(root, info["path"]), writer.storage_options))
    out = {**info, "rows": npy.rows, "offset": npy.offset}
    etag = writer.etag(posixpath.join(under, info["path"]) if under else info["path"])
    if etag is not None:
        out["etag"] = etag
    return out


def _dump(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def quoted(patterns: Sequence[str | os.PathLike[str]]) -> str:
    """File patterns as a shell takes them (for a command to print)."""
    return " ".join(shlex.quote(os.fspath(p)) for p in patterns)


def catalog_dir(patterns: Sequence[str], index_dir: str | None) -> str:
    """Where the catalog of files named by ``patterns`` lives: ``index_dir``, else the
    folder the patterns share before any wildcard (found with no request)."""
    if index_dir is not None:
        return index_dir
    heads = []
    for pattern in patterns:
        for literal in expand_braces(pattern):
            cut = min([literal.index(c) for c in _GLOB if c in literal] or [len(literal)])
            head = literal[:cut]
            heads.append(head.rsplit("/", 1)[0] if "/" in head else "")
    common = heads[0]
    for head in heads[1:]:
        while not (head == common or head.startswith(common.rstrip("/") + "/")):
            common = common.rsplit("/", 1)[0] if "/" in common else ""
    return common or "."


def read_catalog(
    patterns: Sequence[str],
    *,
    kind: str,
    index_dir: str | None,
    storage_options: Mapping[str, Any] | None,
) -> tuple[str, list[dict[str, Any]], dict[str, Any]] | None:
    """The catalog of the files ``patterns`` name, in their order (``expand_paths``'s: each
    pattern's matches sorted, patterns in the order given), as ``(its folder, its entries,
    the whole catalog)``; one request. ``None`` where there is none, or it does not hold
    every file named (a file added since it was written)."""
    folder = catalog_dir(patterns, index_dir)
    catalog = read_json(join(folder, CATALOG), storage_options)
    if catalog is None or catalog.get("format") != CATALOG_FORMAT:
        return None
    if catalog["kind"] not in (kind, MIXED):
        return None
    entries = {_norm(_entry_path(folder, e["path"])): e for e in catalog["files"]}
    chosen: list[dict[str, Any]] = []
    for pattern in patterns:
        for literal in expand_braces(pattern):
            if any(c in literal for c in _GLOB):
                matches = sorted(p for p in entries if _glob_match(p, _norm(literal)))
                named = matches
            else:
                matches = [_norm(literal)] if _norm(literal) in entries else []
                named = [literal]
            if not matches:
                return None
            chosen += [{**entries[m], "path": n} for m, n in zip(matches, named, strict=True)]
    if any(e.get("meta", {}).get("kind", kind) != kind for e in chosen):
        return None  # a catalog of files of several kinds, these not all of this one
    return folder, chosen, catalog


def _entry_path(folder: str, path: str) -> str:
    """A catalog entry's path: relative to the catalog's folder, or whole (a file
    elsewhere: an ``index_dir`` away from the data)."""
    return path if is_url(path) or os.path.isabs(path) else join(folder, path)


def _norm(path: str) -> str:
    return path if is_url(path) else os.path.normpath(path)


def _glob_match(path: str, pattern: str) -> bool:
    """Whether ``path`` matches ``pattern`` as ``glob`` would: ``*``, ``?`` and ``[...]``
    within one folder of the path, ``**`` over any number of folders."""
    return _match(path.split("/"), pattern.split("/"))


def _match(parts: list[str], pattern: list[str]) -> bool:
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_match(parts[i:], pattern[1:]) for i in range(len(parts) + 1))
    if not parts or not fnmatch.fnmatchcase(parts[0], pattern[0]):
        return False
    return _match(parts[1:], pattern[1:])


def write_file_catalog(
    folder: str,
    kind: str,
    entries: Sequence[Mapping[str, Any]],
    storage_options: Mapping[str, Any] | None,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """Writes the catalog of a set of files in ``folder`` (each entry's ``path`` written
    relative to it where it is under it, else whole); returns where."""
    files = []
    local = not is_url(folder)
    root = (os.path.abspath(folder) if local else folder).rstrip("/") + "/"
    for entry in entries:
        path = _norm(entry["path"])
        path = os.path.abspath(path) if local and not is_url(path) else path
        files.append({**entry, "path": path[len(root) :] if path.startswith(root) else path})
    body = {"format": CATALOG_FORMAT, "kind": kind, **(extra or {}), "files": files}
    FolderWriter(folder, storage_options).write(CATALOG, _dump(body))
    return join(folder, CATALOG)


def stamp(path: str, storage_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """What tells a file's version: its size and modification time (local), or its size
    and ETag (or modification time) behind a URL."""
    if not is_url(path):
        info = os.stat(path)
        return {"size": info.st_size, "mtime_ns": info.st_mtime_ns}
    fs, inner = require_fsspec().core.url_to_fs(path, **dict(storage_options or {}))
    info = fs.info(inner)
    out: dict[str, Any] = {"size": int(info["size"])}
    for key in ("ETag", "etag", "md5Hash", "LastModified", "mtime", "last_modified"):
        if info.get(key) is not None:
            out[key.lower()] = str(info[key])
            break
    return out


def changed(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> str | None:
    """How a file differs from when it was indexed (``None``: it does not)."""
    for key, value in current.items():
        if key in recorded and recorded[key] != value:
            return f"its {key} is {value} now, {recorded[key]} when it was indexed"
    return None
