"""``meshfeed.index``: streaming files indexed once, in parallel, resumable per file.

``index(files)`` scans each file that has no index yet (or whose file changed since) and
writes its sidecar; a file whose index is current is skipped, so a run killed half way
is finished by running it again. Files are indexed by ``workers`` processes started in
a bare meshfeed (no JAX; ``workers._bare``), a file at a time each, or only share ``i``
of ``n`` of the files with ``part=(i, n)`` -- one ``meshfeed index --part i/n`` per
machine of a cluster. ``seekable=True`` first rewrites single-member compressed JSON
Lines files in members of 1 MiB of text (the same text for every reader; see
``_jsonl``), each replaced whole or not at all.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
import types
from collections.abc import Mapping, Sequence
from typing import Any

from meshfeed.data._writer import FolderWriter
from meshfeed.formats._index import changed, kind_of, load_index, save_index, stamp
from meshfeed.formats._jsonl import SEEKABLE_MEMBER, scan_jsonl
from meshfeed.formats._tar_scan import scan_tar
from meshfeed.formats._tfrecord import scan_tfrecord
from meshfeed.storage._blob import Blob, is_url
from meshfeed.storage._compressed import Inflater, compress_members, compression_of
from meshfeed.storage._paths import expand_paths
from meshfeed.workers._bare import bare_argv, load_on_use

SCANS = {"tar": scan_tar, "jsonl": scan_jsonl, "tfrecord": scan_tfrecord}
PER_PROCESS = 256 << 20
"""Bytes to index per worker process, at least."""


@dataclasses.dataclass(frozen=True)
class IndexReport:
    """What ``meshfeed.index`` did: files indexed now, files already indexed, samples."""

    indexed: list[str]
    current: list[str]
    samples: int
    seconds: float
    bytes_scanned: int

    def __str__(self) -> str:
        rate = self.bytes_scanned / max(self.seconds, 1e-9) / 1e6
        return (
            f"indexed {len(self.indexed)} files ({self.samples:,} samples, "
            f"{self.bytes_scanned / 1e6:,.1f} MB at {rate:,.0f} MB/s); "
            f"{len(self.current)} were indexed already"
        )


def index(
    files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    index_dir: str | os.PathLike[str] | None = None,
    workers: int | None = None,
    part: tuple[int, int] | None = None,
    seekable: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    progress: bool = True,
) -> IndexReport:
    """Indexes WebDataset tar shards, JSON Lines and TFRecord files for random access.

    Args:
      files: paths, globs, brace patterns or URLs of ``.tar``, ``.jsonl``,
        ``.jsonl.gz``, ``.jsonl.zst`` and ``.tfrecord`` files.
      index_dir: where to write the indexes (default: beside each file), for data in a
        read-only place; pass the same ``index_dir`` to the source.
      workers: processes indexing files at once (default: one per core, at most one per
        file and one per 256 MiB; a small set is indexed in this process).
      part: ``(i, n)``: index only share ``i`` of ``n`` of the files, for ``n`` runs on
        separate machines.
      seekable: first rewrite compressed JSON Lines files of one large member as members
        of 1 MiB of text (still one valid stream for any tool), so their records can be
        read one at a time.
      storage_options: for URLs, the filesystem's options.
      progress: print a line per file indexed.

    Returns:
      An ``IndexReport``.
    """
    if workers is not None and (
        not isinstance(workers, int) or isinstance(workers, bool) or workers < 1
    ):
        raise ValueError(f"workers={workers!r} must be an int >= 1.")
    if part is not None and not (
        isinstance(part, tuple) and len(part) == 2 and all(isinstance(x, int) for x in part)
        and 0 <= part[0] < part[1]
    ):  # fmt: skip
        raise ValueError(f"part={part!r} must be (i, n) with 0 <= i < n, e.g. part=(0, 4).")
    paths = expand_paths(files, storage_options, what="files")
    for p in paths:
        if kind_of(p) is None:
            raise ValueError(
                f"{p}: meshfeed.index reads .tar, .jsonl[.gz|.zst] and .tfrecord files."
            )
    share = [p for i, p in enumerate(paths) if part is None or i % part[1] == part[0]]
    root = None if index_dir is None else os.fspath(index_dir)
    start = time.perf_counter()
    if seekable:
        for p in share:
            make_seekable(p, storage_options)
    todo, current = [], []
    for p in share:
        found = load_index(p, root, storage_options)
        if found is not None and changed(found.meta["file"], stamp(p, storage_options)) is None:
            current.append(p)
        else:
            todo.append(p)
    scanned = sum(Blob(p, storage_options).size() for p in todo)
    # A process pays for itself past a few hundred MB (starting one takes ~0.2 s; a scan
    # runs at ~0.5-1 GB/s): below that, this process scans alone.
    count = min(workers or os.cpu_count() or 1, len(todo), 1 + scanned // PER_PROCESS)
    samples = 0
    if count == 1:
        for p in todo:
            found = index_one(p, root, storage_options)
            samples += found
            if progress:
                print(f"index: {p} ({found:,} samples)", file=sys.stderr, flush=True)
    elif todo:
        samples = _run(todo, count, root, storage_options, progress)
    return IndexReport(todo, current, samples, time.perf_counter() - start, scanned)


def index_one(path: str, index_dir: str | None, storage_options: Mapping[str, Any] | None) -> int:
    """Indexes one file in this process; returns its samples."""
    kind = kind_of(path)
    assert kind is not None
    before = stamp(path, storage_options)
    result = SCANS[kind](Blob(path, storage_options))
    result.meta["file"] = before
    save_index(path, result, index_dir, storage_options)
    return result.samples


def _run(
    todo: list[str],
    count: int,
    root: str | None,
    storage_options: Mapping[str, Any] | None,
    progress: bool,
) -> int:
    shares = [todo[k::count] for k in range(count)]
    spec = {"root": root, "storage_options": dict(storage_options or {})}
    procs = [
        subprocess.Popen(
            bare_argv(
                "meshfeed.formats._build",
                json.dumps({**spec, "files": s}),
                json.dumps(list(sys.path)),
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for s in shares
    ]
    samples, errors = 0, []
    for proc in procs:
        out, err = proc.communicate()
        for line in out.splitlines():
            kind, _, rest = line.partition(" ")
            if kind == "done":
                count_, _, path = rest.partition(" ")
                samples += int(count_)
                if progress:
                    print(f"index: {path} ({int(count_):,} samples)", file=sys.stderr, flush=True)
            elif kind == "error":
                errors.append(rest)
        if proc.returncode and not errors:
            errors.append(
                err.strip().splitlines()[-1] if err.strip() else f"exit code {proc.returncode}"
            )
    if errors:
        raise ValueError(errors[0])
    return samples


def main(package: types.ModuleType, spec: str, path: str) -> None:
    """An indexing worker: its files, one at a time; a line per file on stdout."""
    load_on_use(package)
    sys.path[:0] = [p for p in json.loads(path) if p not in sys.path]
    args = json.loads(spec)
    for file in args["files"]:
        try:
            samples = index_one(file, args["root"], args["storage_options"])
        except (ValueError, OSError) as error:
            print(f"error {str(error).splitlines()[0]}", flush=True)
            sys.exit(1)
        print(f"done {samples} {file}", flush=True)


def make_seekable(path: str, storage_options: Mapping[str, Any] | None) -> bool:
    """Rewrites a compressed JSON Lines file of one large member in members of 1 MiB of
    text; returns whether it did (a file already in small members is left as it is)."""
    kind = compression_of(path)
    if kind is None or kind_of(path) != "jsonl":
        return False
    blob = Blob(path, storage_options)
    size = blob.size()
    inflater = Inflater(kind, path)
    text = b"".join(
        piece
        for a in range(0, size, 8 << 20)
        for piece in inflater.feed(blob.read(a, min(size, a + (8 << 20))))
    )
    inflater.close()
    if inflater.members and max(m[3] - m[2] for m in inflater.members) <= 2 * SEEKABLE_MEMBER:
        return False
    folder, name = path.rsplit("/", 1) if "/" in path else (".", path)
    if not is_url(folder):
        os.makedirs(folder, exist_ok=True)
    FolderWriter(folder, storage_options).write(name, compress_members(kind, text, SEEKABLE_MEMBER))
    return True
