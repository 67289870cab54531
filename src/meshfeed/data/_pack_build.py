"""Building a kept packing plan: its shards, on this process, worker processes or Ray.

A shard of the plan is ``WINDOWS_PER_SHARD`` windows of documents (``plan_windows``), so
which rows a shard holds depends on the data and the settings alone: any builder writes
the same files, one process or many, and a shard can be built on its own. A shard is
done when its files are written and then its entry (``<shard>.done.json``: its manifest
entry, counts and pieces); a build killed midway redoes only the shards without one.
Local workers read the documents' lengths from one ``.npy`` the builder writes once to a
local temporary folder (memory-mapped: the page cache holds one copy for all of them).
On Ray (``executor="ray"``) a task builds each shard wherever the cluster has a CPU: the
lengths go once into Ray's object store, which hands every task on a node the same
read-only copy, and a shard lost with its node is built again by Ray's retry -- the same
bytes, since nothing of the builder reaches them; the plan's folder must then be one
every node reaches (a URL, or a shared file system). Once every shard is done the
builder reads the plan back in order for its digest -- the one ``PackPlan.digest`` gives
the same plan in memory -- and writes the manifest, which makes the plan whole.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import io
import json
import multiprocessing
import os
import sys
import tempfile
from collections.abc import Mapping
from typing import Any, Literal, cast

import numpy as np

from meshfeed.cluster._ray_connect import RayOptions, connect
from meshfeed.data._folder import FORMAT, MANIFEST, join, read_json
from meshfeed.data._pack_plan import Shape, narrow_lengths, no_tokens, plan_windows
from meshfeed.data._writer import FolderWriter
from meshfeed.storage._blob import Blob

WINDOWS_PER_SHARD = 16
"""Windows of documents a shard of the plan holds (262,144 documents by default)."""
FIELDS = ("doc", "piece", "length")
KEYS = ("seed", "algorithm", "window", "long_docs", "max_segments")
PlanExecutor = Literal["local", "ray"]
"""Where ``pack`` builds a kept plan: ``"local"`` processes, or ``"ray"`` tasks."""
EXECUTORS = ("local", "ray")


def build_plan(
    lengths: np.ndarray,
    seq_len: int,
    settings: Mapping[str, Any],
    folder: str,
    options: Mapping[str, Any] | None,
    record: dict[str, Any],
    *,
    workers: int = 1,
    executor: PlanExecutor = "local",
) -> dict[str, Any]:
    """Builds the plan of documents of ``lengths`` into ``folder`` (shards on ``workers``
    processes, or as Ray tasks), then its manifest, ``record`` completed in it; returns
    the manifest."""
    lengths = narrow_lengths(lengths)
    window = int(settings["window"])
    per_shard = window * WINDOWS_PER_SHARD
    count = max(1, -(-len(lengths) // per_shard))
    shape = Shape(lengths, seq_len, settings["long_docs"])
    writer = FolderWriter(folder, options)
    todo = [s for s in range(count) if read_json(join(folder, _done(s)), options) is None]
    job = {
        "seq_len": seq_len,
        "settings": dict(settings),
        "folder": folder,
        "options": options,
        "types": _types(shape),
    }
    said = _Said(folder, len(todo), count)
    if executor == "ray" and todo:
        _on_ray(job, lengths, todo, said)
    elif workers > 1 and len(todo) > 1:
        with tempfile.TemporaryDirectory(prefix="meshfeed-pack-") as scratch:
            job["lengths"] = os.path.join(scratch, "lengths.npy")
            np.save(job["lengths"], lengths)
            spawn = multiprocessing.get_context("spawn")
            with concurrent.futures.ProcessPoolExecutor(workers, mp_context=spawn) as pool:
                for _ in pool.map(build_shard, [job] * len(todo), todo):
                    said.one()
    else:
        for s in todo:
            build_shard(job, s, lengths)
            said.one()
    entries = [read_json(join(folder, _done(s)), options) for s in range(count)]
    if any(e is None for e in entries):
        raise RuntimeError(f"{folder}: a shard of the plan is missing after its build.")
    stats: dict[str, int] = {}
    for entry in entries:
        for k, v in entry["stats"].items():
            stats[k] = stats.get(k, 0) + int(v)
    pieces = sum(int(e["pieces"]) for e in entries)
    if not pieces:
        raise no_tokens()
    kept = [e for e in entries if e["rows"]]
    record.update(
        rows=sum(int(e["rows"]) for e in kept),
        tokens=sum(int(e["tokens"]) for e in kept),
        stats=stats,
        digest=_digest(writer, kept, seq_len, _types(shape)),
    )
    manifest = {
        "format": FORMAT,
        "num_examples": record["rows"],
        "fields": {n: {"shape": [None], "dtype": _types(shape)[n]} for n in FIELDS},
        "shards": [e["entry"] for e in kept],
        "pack": record,
    }
    writer.write(MANIFEST, json.dumps(manifest, indent=1).encode())
    return manifest


class _Said:
    """A long build's progress on stderr: a line each tenth of its shards, and at the end
    (nothing for a build of under 10 shards)."""

    def __init__(self, folder: str, todo: int, count: int) -> None:
        self.folder = folder
        self.todo = todo
        self.count = count
        self.done = 0

    def one(self) -> None:
        self.done += 1
        if self.todo >= 10 and (10 * self.done // self.todo) > (10 * (self.done - 1) // self.todo):
            left = self.count - self.todo
            sys.stderr.write(
                f"meshfeed: {self.folder}: {self.done + left:,} of {self.count:,} shards of "
                "the plan built\n"
            )


def _done(shard: int) -> str:
    return f"done/{shard:05d}.json"


def _types(shape: Shape) -> dict[str, str]:
    return {
        "doc": shape.doc.str,
        "piece": shape.piece.str,
        "length": shape.length.str,
        "row_start": shape.row_start.str,
    }


def _on_ray(job: dict[str, Any], lengths: np.ndarray, todo: list[int], said: _Said) -> None:
    """Builds the shards ``todo`` as Ray tasks, a shard each, on the cluster ``connect``
    reaches; the first error cancels the rest (their shards stay undone)."""
    ray = connect(RayOptions())
    task = ray.remote(num_cpus=1)(build_shard)
    shared = ray.put(lengths)
    pending = {task.remote(job, s, shared): s for s in todo}
    try:
        while pending:
            finished, _ = ray.wait(list(pending), num_returns=1)
            pending.pop(finished[0])
            ray.get(finished[0])
            said.one()
    finally:
        for ref in pending:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)


def build_shard(job: Mapping[str, Any], shard: int, lengths: np.ndarray | None = None) -> None:
    """Plans shard ``shard``'s windows and writes its files, then its entry (a worker's
    task: everything it needs is in ``job``, the lengths too unless given)."""
    if lengths is None:
        lengths = cast(np.ndarray, np.load(job["lengths"], mmap_mode="r"))
    settings = job["settings"]
    types = job["types"]
    window = int(settings["window"])
    first = shard * WINDOWS_PER_SHARD * window
    stats: dict[str, int] = {}
    windows = plan_windows(
        lengths,
        job["seq_len"],
        ordered=bool(settings.get("ordered")),
        stats=stats,
        span=(first, min(len(lengths), first + WINDOWS_PER_SHARD * window)),
        **{k: settings[k] for k in KEYS},
    )
    parts = list(windows)
    counts = np.concatenate([p[3] for p in parts]) if parts else np.zeros(0, np.int32)
    offsets = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    writer = FolderWriter(job["folder"], job["options"])
    files: dict[str, Any] = {}
    tokens = 0
    for i, name in enumerate(FIELDS):
        values = np.concatenate([p[i] for p in parts]) if parts else np.zeros(0)
        values = values.astype(np.dtype(types[name]))
        if name == "length":
            tokens = int(values.sum(dtype=np.int64))
        if len(counts):
            files[name] = {
                "values": writer.npy(f"{name}/{shard:05d}.values.npy", values),
                "offsets": writer.npy(f"{name}/{shard:05d}.offsets.npy", offsets),
            }
    entry = {
        "entry": {"rows": len(counts), "files": files},
        "rows": len(counts),
        "pieces": int(offsets[-1]),
        "tokens": tokens,
        "stats": stats,
    }
    writer.write(_done(shard), json.dumps(entry).encode())


def _digest(
    writer: FolderWriter, entries: list[dict[str, Any]], seq_len: int, types: Mapping[str, str]
) -> str:
    """``PackPlan.digest`` of the plan in ``entries``' shards, read back in order: every
    shard's documents, then their piece numbers, their lengths, then the row starts."""
    h = hashlib.sha256(str(seq_len).encode())
    for name in FIELDS:
        h.update(types[name].encode())
        for e in entries:
            h.update(_load(writer, e["entry"]["files"][name]["values"]["path"]).tobytes())
    h.update(types["row_start"].encode())
    at = 0
    h.update(np.zeros(1, np.dtype(types["row_start"])).tobytes())
    for e in entries:
        offsets = _load(writer, e["entry"]["files"]["doc"]["offsets"]["path"])
        h.update((at + offsets[1:]).astype(np.dtype(types["row_start"])).tobytes())
        at += int(offsets[-1])
    return h.hexdigest()[:16]


def _load(writer: FolderWriter, relative: str) -> np.ndarray:
    """A ``.npy`` of the plan, read whole (one request behind a URL)."""
    return np.load(io.BytesIO(Blob(join(writer.root, relative), writer.storage_options).read_all()))
