"""The inputs of a build, and the parts they are cut into -- from the inputs alone.

``expand`` turns what the user names (paths, globs, URLs, a ``datasets.Dataset``) into a
list of input files with their kinds and sizes, in the order given (a glob's matches
sorted). ``plan_parts`` cuts them into parts, each a unit of work and one part folder of
the output:

- an uncompressed ``.jsonl`` (or ``.txt`` read a line per document) larger than
  ``part_bytes``: byte ranges of ``part_bytes``; a line belongs to the range its first
  byte is in, so a reader of range ``[a, b)`` skips to the first line starting at or
  after ``a`` and reads lines starting before ``b``;
- a compressed ``.jsonl.gz`` / ``.jsonl.zst``: the whole file (a compressed stream
  cannot be entered in the middle);
- a ``.parquet``: runs of consecutive row groups of about ``part_bytes`` (uncompressed,
  from the footer's metadata);
- ``.txt`` files read as one document each: runs of consecutive files of about
  ``part_bytes``;
- a ``datasets.Dataset``: runs of rows of about ``part_bytes`` (from the Arrow table's
  size).

Nothing here depends on how many workers will run: the parts, their order and their
contents are fixed by the files and ``part_bytes``, so the output is the same bytes for
any number of workers, on one machine or many.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from meshfeed.storage._blob import Blob, is_url
from meshfeed.storage._paths import expand_paths, kind_by_suffix

KINDS = {
    ".jsonl": "jsonl",
    ".jsonl.gz": "jsonl.gz",
    ".jsonl.zst": "jsonl.zst",
    ".parquet": "parquet",
    ".txt": "txt",
}
"""File suffix -> input kind."""
PART_BYTES = 32 << 20
"""The most input bytes a part by default (uncompressed text, or Parquet's uncompressed
size)."""
MIN_PART_BYTES = 1 << 20
"""The fewest input bytes a part by default."""
PARTS = 64
"""Parts the inputs are cut into by default, within those bounds: parts are what workers
take, so with few of them the workers end far apart (8 parts of 2.5 MB on 2 workers left
one idle for a part's time); with ~64 they end within ~1/32 of the run of each other."""

InputFile = dict[str, Any]
"""``{"path", "kind", "size"}`` (a dataset: ``{"path": "datasets.Dataset:<fingerprint>",
"kind": "dataset", "size": rows, "bytes": table bytes}``)."""
Part = dict[str, Any]
"""``{"input": i, "unit": "bytes" | "row_groups" | "files" | "rows" | "whole", "range":
[a, b]}``: which slice of which input (for ``files``, inputs ``a .. b-1``)."""


def default_part_bytes(files: list[InputFile]) -> int:
    """Input bytes a part for ``files``: their bytes over ``PARTS``, within
    ``MIN_PART_BYTES`` and ``PART_BYTES`` (a function of the inputs alone)."""
    total = sum(f["bytes"] if f["kind"] == "dataset" else f["size"] for f in files)
    return min(PART_BYTES, max(MIN_PART_BYTES, -(-total // PARTS)))


def kind_of(path: str) -> str | None:
    """The kind of input a file is, by its suffix."""
    return kind_by_suffix(path, KINDS)


def expand(
    inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    storage_options: Mapping[str, Any] | None = None,
) -> list[InputFile]:
    """The input files named by paths, globs or URLs, in order, with kinds and sizes."""
    files: list[InputFile] = []
    for path in expand_paths(inputs, storage_options):
        kind = kind_of(path)
        if kind is None:
            raise ValueError(
                f"{path}: meshfeed.prepare reads {', '.join(KINDS)} files; rename it, or "
                "convert it to one of those."
            )
        files.append({"path": path, "kind": kind, "size": _size(path, storage_options)})
    return files


def dataset_input(dataset: Any) -> InputFile:
    """A ``datasets.Dataset`` as one input (its fingerprint names it)."""
    return {
        "path": f"datasets.Dataset:{getattr(dataset, '_fingerprint', 'unknown')}",
        "kind": "dataset",
        "size": len(dataset),
        "bytes": int(dataset.data.nbytes),
    }


def plan_parts(
    files: list[InputFile],
    *,
    part_bytes: int,
    txt: str,
    storage_options: Mapping[str, Any] | None = None,
) -> list[Part]:
    """The parts of the build (the module docstring)."""
    parts: list[Part] = []
    group: list[int] = []  # .txt files read whole, gathered into parts
    group_bytes = 0
    for i, f in enumerate(files):
        if f["kind"] == "txt" and txt == "file":
            if group and group_bytes + f["size"] > part_bytes:
                parts.append({"input": group[0], "unit": "files", "range": [group[0], i]})
                group, group_bytes = [], 0
            group.append(i)
            group_bytes += f["size"]
            continue
        if group:
            parts.append({"input": group[0], "unit": "files", "range": [group[0], i]})
            group, group_bytes = [], 0
        if f["kind"] in ("jsonl", "txt"):
            size = f["size"]
            for a in range(0, max(size, 1), part_bytes):
                parts.append({"input": i, "unit": "bytes", "range": [a, min(size, a + part_bytes)]})
        elif f["kind"] == "parquet":
            parts += _row_group_parts(i, f["path"], part_bytes, storage_options)
        elif f["kind"] == "dataset":
            per_row = max(1.0, f["bytes"] / max(1, f["size"]))
            rows = max(1, int(part_bytes // per_row))
            for a in range(0, max(f["size"], 1), rows):
                parts.append({"input": i, "unit": "rows", "range": [a, min(f["size"], a + rows)]})
        else:  # compressed: one part per file
            parts.append({"input": i, "unit": "whole", "range": [0, f["size"]]})
    if group:
        parts.append({"input": group[0], "unit": "files", "range": [group[0], len(files)]})
    return parts


def open_parquet(path: str, storage_options: Mapping[str, Any] | None) -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(
            f"{path}: reading Parquet needs pyarrow: pip install 'meshfeed[parquet]' (from a "
            "clone: pip install -e '.[parquet]')."
        ) from None
    if not is_url(path):
        return pq.ParquetFile(path)
    return pq.ParquetFile(Blob(path, storage_options).open())


def _row_group_parts(
    i: int, path: str, part_bytes: int, storage_options: Mapping[str, Any] | None
) -> list[Part]:
    metadata = open_parquet(path, storage_options).metadata
    parts, start, size = [], 0, 0
    for g in range(metadata.num_row_groups):
        size += metadata.row_group(g).total_byte_size
        if size >= part_bytes:
            parts.append({"input": i, "unit": "row_groups", "range": [start, g + 1]})
            start, size = g + 1, 0
    if start < metadata.num_row_groups or not parts:
        parts.append({"input": i, "unit": "row_groups", "range": [start, metadata.num_row_groups]})
    return parts


def _size(path: str, storage_options: Mapping[str, Any] | None) -> int:
    return Blob(path, storage_options).size()
