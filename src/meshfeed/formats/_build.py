"""``meshfeed.index``: streaming files indexed once, in parallel, resumable per file.

``index(files)`` scans each file that has no index yet (or whose file changed since) and
writes its sidecar; a file whose index is current is skipped, so a run killed half way
is finished by running it again. Files are indexed by ``workers`` processes started in
a bare meshfeed (no JAX; ``workers._bare``), a file at a time each, or only share ``i``
of ``n`` of the files with ``part=(i, n)`` -- one ``meshfeed index --part i/n`` per
machine of a cluster -- or, with ``executor="ray"``, by one Ray task per file on the
cluster ``cluster._ray_connect`` connects to (the one this process is
on, else ``RAY_ADDRESS``'s, else a local Ray of its own, as ``worker_type="ray"`` does);
each task writes its file's index as this process would, so the indexes are the same
bytes and a run on Ray resumes per file too. ``seekable=True`` first rewrites compressed
files of one large member seekable -- JSON Lines in members of 1 MiB of text (``_jsonl``),
tar shards and TFRecord files with a restart point every 1 MiB (``_members``) -- the same
data for every reader, each file replaced whole or not at all.

One process scans tar shards of small members about as fast as a disk reads them cold
(1.3-1.4 GB/s parsed on a core, against 1.0-1.4 GB/s read on the machine the benchmarks
run on), and starting a worker process costs ~0.15 s (numpy's import): so a set below
``PER_PROCESS`` bytes is scanned in the calling process. 369 MB of shards indexed there
at 0.79-0.88x the speed of a plain read, and at 0.59-0.67x by two worker processes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import time
import types
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from meshfeed.cluster._ray_connect import RayOptions, connect, import_ray
from meshfeed.data._catalog import (
    MIXED,
    catalog_dir,
    changed,
    stamp,
    write_catalog,
    write_file_catalog,
)
from meshfeed.data._parquet_files import catalog_entries
from meshfeed.data._writer import FolderWriter
from meshfeed.formats._index import Index, kind_of, load_index, save_index
from meshfeed.formats._jsonl import SEEKABLE_MEMBER, scan_jsonl
from meshfeed.formats._members import compression, needs_rewrite, rewrite_seekable
from meshfeed.formats._tar_scan import scan_tar
from meshfeed.formats._tfrecord import scan_tfrecord
from meshfeed.storage._blob import Blob, is_url
from meshfeed.storage._compressed import Inflater, compress_members
from meshfeed.storage._file_errors import named
from meshfeed.storage._paths import expand_paths
from meshfeed.workers._bare import bare_argv, load_on_use

SCANS = {"tar": scan_tar, "jsonl": scan_jsonl, "tfrecord": scan_tfrecord}
PER_PROCESS = 512 << 20
"""Bytes to index per worker process, at least (the module docstring)."""


@dataclasses.dataclass(frozen=True)
class IndexReport:
    """What ``meshfeed.index`` did: files indexed now, files already indexed, samples."""

    indexed: list[str]
    current: list[str]
    samples: int
    seconds: float
    bytes_scanned: int
    catalog: str | None = None  # where the catalog over every file was written

    def __str__(self) -> str:
        rate = self.bytes_scanned / max(self.seconds, 1e-9) / 1e6
        return (
            f"indexed {len(self.indexed)} files ({self.samples:,} samples, "
            f"{self.bytes_scanned / 1e6:,.1f} MB at {rate:,.0f} MB/s); "
            f"{len(self.current)} were indexed already"
            + (f"; their catalog: {self.catalog}" if self.catalog else "")
        )


def index(
    files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    index_dir: str | os.PathLike[str] | None = None,
    workers: int | None = None,
    part: tuple[int, int] | None = None,
    executor: Literal["local", "ray"] = "local",
    seekable: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    progress: bool = True,
) -> IndexReport:
    """Indexes WebDataset tar shards, JSON Lines and TFRecord files for random access, and
    writes the catalog a host opens them from (also of Parquet files and meshfeed folders).

    Every file is indexed (beside it, or in ``index_dir``), then the catalog over them,
    ``meshfeed.catalog.json``, is written in the folder the files share (or in
    ``index_dir``): each file's stamp, samples and index summary, which a source opens
    with one request whatever the number of files. Parquet files are not indexed (their
    footers are their index): their catalog holds each file's row groups and the fields.
    A meshfeed folder written before catalogs (or a folder of parts) gets its catalog in
    its manifest (or, made by ``prepare``, in its record).

    Args:
      files: paths, globs, brace patterns or URLs of ``.tar`` (``.tgz``, ``.tar.gz``,
        ``.tar.zst``), ``.jsonl`` (``.jsonl.gz``, ``.jsonl.zst``), ``.tfrecord``
        (``.tfrecord.gz``) or ``.parquet`` files; or one meshfeed folder.
      index_dir: where to write the indexes (default: beside each file), for data in a
        read-only place; pass the same ``index_dir`` to the source.
      workers: with ``executor="local"``, processes indexing files at once (default:
        one per core, at most one per file and one per 512 MiB; a smaller set is indexed
        in this process).
      part: ``(i, n)``: index only share ``i`` of ``n`` of the files, for ``n`` runs on
        separate machines (no catalog: run once more without ``part`` when all are done,
        which finds every index current and writes the catalog).
      executor: ``"local"``: this process or ``workers`` processes on this machine;
        ``"ray"``: one Ray task per file on the cluster this process is connected to,
        else the one ``RAY_ADDRESS`` names, else a local Ray of its own; the files must
        be reachable from its nodes (a shared file system, or URLs). Needs the ``ray``
        extra.
      seekable: first rewrite compressed files of one large member (what ``gzip``, ``zstd``
        and ``tar czf`` write) seekable, a restart point every 1 MiB of data (still one
        valid stream for any tool, webdataset's reader too), so their samples can be read
        one at a time.
      storage_options: for URLs, the filesystem's options.
      progress: print a line per file indexed.

    Returns:
      An ``IndexReport``.

    Example:
      >>> meshfeed.index("shards/shard-{000..127}.tar", executor="ray")  # doctest: +SKIP
    """
    if executor not in ("local", "ray"):
        raise ValueError(
            f"executor={executor!r} must be 'local' (processes on this machine) or 'ray' "
            "(a Ray task per file)."
        )
    if workers is not None and (
        not isinstance(workers, int) or isinstance(workers, bool) or workers < 1
    ):
        raise ValueError(f"workers={workers!r} must be an int >= 1.")
    if part is not None and not (
        isinstance(part, tuple)
        and len(part) == 2
        and all(isinstance(x, int) for x in part)
        and 0 <= part[0] < part[1]
    ):
        raise ValueError(f"part={part!r} must be (i, n) with 0 <= i < n, e.g. part=(0, 4).")
    if executor == "ray":
        import_ray("executor='ray'")
    start = time.perf_counter()
    given = [os.fspath(files)] if isinstance(files, str | os.PathLike) else list(files)
    if len(given) == 1 and _folder(os.fspath(given[0])):  # a meshfeed folder: its catalog
        where = write_catalog(os.fspath(given[0]), storage_options)
        return IndexReport([], [], 0, time.perf_counter() - start, 0, where)
    paths = expand_paths(files, storage_options, what="files")
    if all(p.lower().endswith(".parquet") for p in paths):  # footers: the catalog only
        entries, fields = catalog_entries(paths, storage_options)
        folder = catalog_dir(
            [os.fspath(p) for p in given], None if index_dir is None else os.fspath(index_dir)
        )
        where = write_file_catalog(folder, "parquet", entries, storage_options, extra=fields)
        samples = sum(e["meta"]["samples"] for e in entries)
        return IndexReport([], paths, samples, time.perf_counter() - start, 0, where)
    for p in paths:
        if kind_of(p) is None:
            raise ValueError(
                f"{p}: meshfeed.index reads .tar[.gz|.zst] (.tgz), .jsonl[.gz|.zst], "
                ".tfrecord[.gz] and .parquet files, or a meshfeed folder."
            )
    share = [p for i, p in enumerate(paths) if part is None or i % part[1] == part[0]]
    root = None if index_dir is None else os.fspath(index_dir)
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
    count = min(workers or os.cpu_count() or 1, len(todo), 1 + scanned // PER_PROCESS)
    samples = 0
    if executor == "ray":
        samples = _run_ray(todo, root, storage_options, progress) if todo else 0
    elif count == 1:
        for p in todo:
            found = index_one(p, root, storage_options)
            samples += found
            if progress:
                print(f"index: {p} ({found:,} samples)", file=sys.stderr, flush=True)
    elif todo:
        samples = _run(todo, count, root, storage_options, progress)
    catalog = None
    if part is None:  # every file indexed: the catalog over them
        catalog = write_index_catalog(given, paths, root, storage_options)
    seconds = time.perf_counter() - start
    return IndexReport(todo, current, samples, seconds, scanned, catalog)


def _folder(path: str) -> bool:
    """Whether ``path`` names a meshfeed folder (no file suffix, no wildcard)."""
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return "." not in name and not any(c in path for c in "*?[{")


def write_index_catalog(
    patterns: Sequence[str | os.PathLike[str]],
    paths: Sequence[str],
    index_dir: str | None,
    storage_options: Mapping[str, Any] | None,
) -> str:
    """Writes the catalog of ``paths`` (named by ``patterns``), each file's index read
    once: its stamp, its samples and what its format summarises (a tar shard's fields,
    and how many samples lack each); returns where it is."""
    entries = []
    for path in paths:
        found = load_index(path, index_dir, storage_options)
        if found is None:
            raise FileNotFoundError(f"{path} has no index: index it before its catalog.")
        entries.append({"path": path, "meta": {**found.meta, **_summary(found)}})
    kinds = {kind_of(p) for p in paths}
    kind = kinds.pop() if len(kinds) == 1 else MIXED
    assert kind is not None
    folder = catalog_dir([os.fspath(p) for p in patterns], index_dir)
    return write_file_catalog(folder, kind, entries, storage_options)


def _summary(index: Index) -> dict[str, Any]:
    """What a source needs of an index before reading its file, beyond its meta."""
    if index.meta.get("kind") != "tar":
        return {}
    offsets = index.arrays["offsets"]
    fields = index.meta["fields"]
    return {"missing": {ext: int((offsets[:, j] < 0).sum()) for j, ext in enumerate(fields)}}


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
    samples = 0
    errors = []
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


def _run_ray(
    todo: list[str], root: str | None, storage_options: Mapping[str, Any] | None, progress: bool
) -> int:
    """Indexes ``todo`` as Ray tasks, a file each; the first error cancels the rest."""
    ray = connect(RayOptions())
    task = ray.remote(num_cpus=1)(ray_index)
    spec = dict(storage_options or {})
    pending = {task.remote(p, root, spec): p for p in todo}
    samples = 0
    try:
        while pending:
            # A finished task and any others finished meanwhile, handled together: fewer
            # passes over the pending list than a wait for each file.
            first, _ = ray.wait(list(pending), num_returns=1)
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
            for ref in dict.fromkeys([*first, *ready]):
                path = pending.pop(ref)
                kind, value = ray.get(ref)
                if kind == "error":
                    raise ValueError(value)
                samples += value
                if progress:
                    print(f"index: {path} ({value:,} samples)", file=sys.stderr, flush=True)
    finally:
        for ref in pending:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
    return samples


def ray_index(path: str, root: str | None, storage_options: dict[str, Any]) -> tuple[str, Any]:
    """One file indexed in a Ray task: ``("done", samples)`` or ``("error", message)``."""
    try:
        return ("done", index_one(path, root, storage_options))
    except (ValueError, OSError) as error:
        return ("error", str(error).splitlines()[0])


def make_seekable(path: str, storage_options: Mapping[str, Any] | None) -> bool:
    """Rewrites a compressed file of one large member seekable, still one valid stream
    for any tool: JSON Lines in members of 1 MiB of text cut at newlines; tar shards and
    TFRecord files with a restart point every 1 MiB of data (one gzip member, restart
    points in its header: ``_restarts``; zstandard frames), cut anywhere (a read takes
    every segment a sample's range covers). Returns whether it did (a file already
    seekable is left as it is)."""
    kind = compression(path)
    if kind is None or kind_of(path) is None:
        return False
    blob = Blob(path, storage_options)
    with named(path, "rewriting it in members"):
        if kind_of(path) == "jsonl":
            data = _jsonl_in_members(blob, kind)
        elif needs_rewrite(blob, kind):
            data = rewrite_seekable(blob, kind)
        else:
            data = None
    if data is None:
        return False
    folder, name = path.rsplit("/", 1) if "/" in path else (".", path)
    if not is_url(folder):
        os.makedirs(folder, exist_ok=True)
    FolderWriter(folder, storage_options).write(name, data)
    return True


def _jsonl_in_members(blob: Blob, kind: str) -> bytes | None:
    """A JSON Lines file's text in members cut at newlines, or ``None`` where its members
    are small already."""
    size = blob.size()
    inflater = Inflater(kind, blob.path)
    text = b"".join(
        piece
        for a in range(0, size, 8 << 20)
        for piece in inflater.feed(blob.read(a, min(size, a + (8 << 20))))
    )
    inflater.close()
    if inflater.members and max(m[3] - m[2] for m in inflater.members) <= 2 * SEEKABLE_MEMBER:
        return None
    return compress_members(kind, text, SEEKABLE_MEMBER)
