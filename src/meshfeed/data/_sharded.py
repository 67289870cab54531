"""A source over ``.npy`` shards, read by byte range: ``ShardedSource``.

What ``open_source`` returns for a meshfeed folder, its parts, or a single ``.npy`` /
``.npz``: the shards' rows, each a ``RowFile`` (or a ragged field's values and offsets),
numbered in shard order. A read gathers each shard's rows in place; behind a URL the
reads of every shard and field a batch touches are in flight together. Nothing is read
when it is made: each file's first read is where it is checked (``Blob.expect``), and an
error there, or in any read, names the file (``storage._file_errors``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from meshfeed.data._files import NpyRows, RaggedRows
from meshfeed.data._sources import (
    FieldSpec,
    check_ids,
    example_at,
    fields_text,
    gather_by_part,
    locate,
)
from meshfeed.storage._blob import is_url
from meshfeed.storage._file_errors import named, names_file
from meshfeed.storage._remote import merge, remote_pool

Rows = NpyRows | RaggedRows


class ShardedSource:
    """A ``Source`` over ``.npy`` shards (a meshfeed folder, or one ``.npy``/``.npz``).

    Rows are read by byte range from the shards that hold them. ``bytes_read`` counts
    the row bytes read so far (headers aside), to see that a process reads only its own;
    behind a URL, ``requests`` and ``bytes_fetched`` count what crossed the network
    (rows less than 64 KiB apart in a file are fetched as one request).
    Behind a URL, the reads of every shard and field a batch touches are in flight
    together.
    ``lengths(field)`` gives a ragged field's document lengths from its offsets. Built by
    ``meshfeed.open_source``.
    """

    def __init__(self, shards: list[dict[str, Rows]], *, name: str) -> None:
        self.name = name
        self._shards = shards
        first = shards[0]
        self._fields = {k: FieldSpec(r.row_shape, r.dtype) for k, r in first.items()}
        self._starts = np.cumsum([0] + [next(iter(s.values())).rows for s in shards])
        self._len = int(self._starts[-1])
        self._remote = is_url(name)
        self.origin: tuple[str, Mapping[str, Any] | None] | None = None
        """The folder it was opened from and its storage options (``open_source``)."""
        self.catalog_digest: str | None = None
        """A hash of the catalog it was opened from, which says whether its files changed."""
        self.classes: list[str] | None = None
        """The class names in label order, for images written by ``shard_images``."""

    @property
    def remote(self) -> bool:
        """Whether the shards are behind a URL."""
        return self._remote

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        """Each field's shape and dtype (per example), by name."""
        return self._fields

    def __len__(self) -> int:
        """The number of examples."""
        return self._len

    @property
    def bytes_read(self) -> int:
        """Bytes read from the shards so far, by every read of this source."""
        return sum(r.bytes_read for shard in self._shards for r in shard.values())

    @property
    def requests(self) -> int:
        """Requests sent to the store behind a URL so far (0 for local files)."""
        return sum(b.fetched.requests for s in self._shards for r in s.values() for b in r.blobs)

    @property
    def bytes_fetched(self) -> int:
        """Bytes received from the store behind a URL so far, gaps between rows included."""
        return sum(b.fetched.bytes for s in self._shards for r in s.values() for b in r.blobs)

    def fetches(self, ids: np.ndarray) -> tuple[int, int]:
        """The requests and bytes reading ``ids`` asks a store for, cache aside (nothing
        is read but a ragged field's offsets, once)."""
        ids = check_ids(ids, self._len, self.name)
        shard, local = locate(self._starts, ids)
        requests = fetched = 0
        for p in np.unique(shard).tolist():
            for rows in self._shards[p].values():
                starts, ends = rows.byte_ranges(local[shard == p])
                merged = merge(starts.tolist(), ends.tolist())
                requests += len(merged)
                fetched += sum(hi - lo for lo, hi, _ in merged)
        return requests, fetched

    def __getitem__(self, ids: np.ndarray | int) -> dict[str, Any]:
        """The examples ``ids`` (a 1-D int array): one array per field, a row per id."""
        if isinstance(ids, int | np.integer):  # source[i]: one example
            return example_at(self, ids)
        ids = check_ids(ids, self._len, self.name)
        shard, local = locate(self._starts, ids)
        parts = np.unique(shard).tolist()
        if not self._remote or all(
            b.local_copy for p in parts for r in self._shards[p].values() for b in r.blobs
        ):  # local files, or local copies (cache_dir) of every file this read touches
            return gather_by_part(shard, local, self._fields, self._read_shard)
        # Behind a URL every read waits on the network: put the reads of every shard and
        # field in flight together (each one all its byte ranges, through cat_ranges).
        pool = remote_pool()
        reads = {
            p: {
                name: pool.submit(read_rows, rows, local[shard == p])
                for name, rows in self._shards[p].items()
            }
            for p in parts
        }
        return gather_by_part(
            shard, local, self._fields, lambda p, _: {k: f.result() for k, f in reads[p].items()}
        )

    def _read_shard(self, shard: int, local: np.ndarray) -> dict[str, Any]:
        return {name: read_rows(rows, local) for name, rows in self._shards[shard].items()}

    def lengths(self, field: str) -> np.ndarray:
        """Every document's length in the ragged ``field`` (read from its offsets)."""
        if field not in self._fields or not self._fields[field].ragged:
            ragged = [k for k, s in self._fields.items() if s.ragged]
            raise ValueError(
                f"lengths({field!r}): that is not a ragged field of {self.name}; its ragged "
                f"fields are {ragged}."
            )
        return np.concatenate([shard[field].lengths() for shard in self._shards])  # type: ignore[union-attr]

    def __repr__(self) -> str:
        shards = len(self._shards)
        return (
            f"ShardedSource({self.name!r}, {self._len} examples in {shards} shards; "
            f"{fields_text(self._fields)})"
        )


def read_rows(rows: Rows, local: np.ndarray) -> Any:
    """``rows.read(local)``; an error that names none of its files is named (the file,
    or a ragged field's values and offsets both), the original as its cause."""
    paths = [blob.path for blob in rows.blobs]
    try:
        return rows.read(local)
    except Exception as error:
        if any(names_file(error, path) for path in paths):
            raise
        with named(" and ".join(paths)):
            raise
