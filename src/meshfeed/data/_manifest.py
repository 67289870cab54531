"""A folder's manifest, read and checked, and the ``.npy`` files it lists opened as it says.

The manifest (``meshfeed.json``) names every shard's files by field. Where it is a
catalog -- each file's rows, where they start, its size, SHA-256 and, behind a URL, its
ETag -- a file opens with nothing read, its size and header checked at its first read
(``cataloged_npy``). A manifest from before catalogs, or any opened with ``verify=True``,
has each file's header and size asked for on open, and with ``verify=True`` its bytes
read once against the SHA-256 (``checked_npy``). ``_store`` walks the shards and picks.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import numpy as np

from meshfeed.data._files import NpyRows
from meshfeed.data._folder import FORMAT, MANIFEST, join
from meshfeed.storage._blob import Blob, is_url
from meshfeed.storage._file_errors import named


def read_manifest(root: str, blob: Callable[[str], Blob]) -> dict[str, Any]:
    """The manifest of the folder at ``root``, read (one request) and checked."""
    manifest_path = join(root, MANIFEST)
    try:
        text = blob(manifest_path).read_all()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{manifest_path} does not exist: {root} is not a meshfeed dataset (or its "
            "write did not finish). Write one with meshfeed.write_source, or open a "
            ".npy/.npz file."
        ) from None
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{manifest_path} is not valid JSON ({error}): corrupt?") from None
    return valid_manifest(manifest, manifest_path)


def valid_manifest(manifest: Any, where: str) -> dict[str, Any]:
    """``manifest`` (read from ``where``), refused unless it is a meshfeed manifest."""
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{where} is not a {FORMAT} manifest.")
    if not isinstance(manifest.get("shards"), list) or not isinstance(manifest.get("fields"), dict):
        raise ValueError(f"{where} is not a {FORMAT} manifest (no list of shards, or no fields).")
    if not manifest["shards"] and manifest.get("num_examples") != 0:
        raise ValueError(f"{where} lists no shards.")
    return manifest


def cataloged_npy(
    root: str, info: dict[str, Any], shape: tuple[int, ...], dtype: np.dtype, blob: Any
) -> NpyRows:
    """One ``.npy`` of a shard as its catalog entry says: nothing read now, its size (its
    ETag behind a URL) and header checked at its first read."""
    rows = NpyRows.at(
        blob(join(root, info["path"])),
        offset=info["offset"],
        rows=info["rows"],
        shape=shape,
        dtype=dtype,
    )
    rows.blob.version = info["sha256"]  # a rewritten file is not read from an old copy
    # Behind a URL, an ETag that matches says the header does too: no request for it.
    check = None if info.get("etag") and is_url(root) else rows.check_header
    rows.blob.expect(info["bytes"], etag=info.get("etag"), check=check)
    return rows


def checked_npy(
    root: str, info: dict[str, Any], rows: int, blob: Callable[[str], Blob], *, verify: bool
) -> NpyRows:
    """One ``.npy`` of a shard, checked against its manifest entry."""
    file_path = join(root, info["path"])
    with named(file_path, "its .npy header"):
        npy = NpyRows(blob(file_path))
    npy.blob.version = info["sha256"]  # a rewritten file is not read from an old copy
    if npy.rows != rows:
        raise ValueError(f"{file_path} has {npy.rows} rows, the manifest says {rows}.")
    size = npy.blob.size()
    if size != info["bytes"]:
        raise ValueError(
            f"{file_path} is {size} bytes, the manifest says {info['bytes']}: the file is "
            "truncated or was replaced."
        )
    npy.check_size(size)
    if verify:
        digest = hashlib.sha256(npy.blob.read(0, size)).hexdigest()
        if digest != info["sha256"]:
            raise ValueError(
                f"{file_path} does not match its checksum in {join(root, MANIFEST)} "
                f"(sha256 {digest[:12]}..., expected {info['sha256'][:12]}...): the file "
                "is corrupt."
            )
    return npy
