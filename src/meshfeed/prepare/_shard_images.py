"""``shard_images``: an image folder written as shards a store serves at its speed.

Read from object storage, ``ImageFolderSource`` costs a request per image: at 30 ms a
request and 64 in flight, about 2,000 images/s a process whatever the bandwidth. This
writes the same images -- each file's bytes unchanged, its label, its id in the folder,
the class list -- as a meshfeed folder of parts, one shard each, which ``open_source``
reads by range: with ``shuffle_block``, a step is a few long runs instead of a request an
image. The images are written in a keyed random order (``seed``), so a run of
neighbours is a draw across classes, not one class's images.

It builds like ``prepare``: the plan (the folder's digest, the settings, the parts, cut
from the images' sizes alone) is kept in ``out/meshfeed.prepare.json`` before any part;
each run writes the parts that have no manifest yet, on local worker processes or Ray
tasks, so a killed build run again redoes only what was not finished, and one planning
another build into the same folder is refused. The run that finds every part written
marks the build complete with every part's manifest as one catalog: a host opens it in
one request. ``open_source`` refuses it until then.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import sys
import time
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from meshfeed.core._permutation import Permutation
from meshfeed.data._catalog import merge_manifests
from meshfeed.data._folder import (
    MANIFEST,
    RECORD,
    RECORD_FORMAT,
    join,
    missing_parts,
    part_folder,
    read_json,
)
from meshfeed.data._image_folder import ImageFolderSource
from meshfeed.data._writer import FolderWriter
from meshfeed.prepare._image_part import ImagesRunner, ray_image_part
from meshfeed.prepare._run import Report, run_local, run_ray, start_workers, stop_workers
from meshfeed.storage._blob import is_url

PART_BYTES = 256 << 20
"""Image bytes a part holds by default: one shard file of about this size."""
UNSIZED_PART = 2048
"""Images a part holds when their sizes are not known (``files=`` sources)."""
COMMAND = "meshfeed shard"

ShardExecutor = Literal["local", "ray"]
"""Where ``shard_images`` runs its parts: local worker processes, or Ray tasks."""


@dataclasses.dataclass(frozen=True)
class ShardStatus:
    """How far a ``shard_images`` build is, and what the last run did.

    ``parts``, ``done`` and ``missing`` count every part of the build; ``images`` and
    ``image_bytes`` are what this run wrote, in ``seconds``.
    """

    out: str
    parts: int
    done: int
    missing: list[int]
    complete: bool
    images: int = 0
    image_bytes: int = 0
    ran: int = 0
    seconds: float = 0.0

    @property
    def images_per_s(self) -> float:
        """This run's images a second."""
        return self.images / self.seconds if self.seconds else 0.0

    def __str__(self) -> str:
        state = "complete" if self.complete else f"{len(self.missing)} parts to go"
        return f"{self.out}: {self.done} of {self.parts} parts written ({state})"


class _Report(Report):
    NAME = "shard"
    COUNTS = ("images", "bytes")

    def _info(self) -> str:
        images = self.counts["images"] + sum(n for n, _ in self._live.values())
        size = self.counts["bytes"] + sum(b for _, b in self._live.values())
        rate = images / max(1e-9, time.perf_counter() - self.start)
        return f"{images:,} images  {size / 2**20:,.0f} MiB  {rate:,.0f} images/s"


def shard_images(
    images: str | os.PathLike[str] | ImageFolderSource,
    out: str | os.PathLike[str],
    *,
    part_bytes: int = PART_BYTES,
    shuffle: bool = True,
    seed: int = 0,
    workers: int | None = None,
    executor: ShardExecutor = "local",
    storage_options: Mapping[str, Any] | None = None,
    progress: bool = True,
) -> ShardStatus:
    """Writes an image folder into shards that ``open_source`` reads by range.

    Args:
      images: an image folder (a path or URL with a subfolder per class, as
        ``ImageFolderSource`` reads it), or an ``ImageFolderSource`` (``files=`` with
        ``label=``, a flat validation folder).
      out: the folder to write (a path or URL): one part folder per part, and
        ``meshfeed.prepare.json``, the build's record.
      part_bytes: image bytes a part holds (one shard file of about this size).
      shuffle: write the images in a keyed random order (``seed``), so the runs a
        ``shuffle_block`` loader reads mix the classes; ``False``: in the folder's order.
      seed: the key of that order.
      workers: local worker processes (default: one per core, at most the parts);
        ``0``: this process alone.
      executor: ``"local"``, or ``"ray"``: one Ray task per part on the cluster
        ``ray.init()`` connects to (the ``ray`` extra).
      storage_options: for URLs, the filesystem's options (``endpoint_url``, ...), for
        ``out`` and for ``images`` given as a URL.
      progress: show progress: a bar on a terminal, a line per part off one.

    Returns:
      A ``ShardStatus``. Open the result with ``open_source(out)``: fields ``image``
      (each file's bytes), ``label`` and ``index`` (the image's id in the folder); its
      ``classes`` are the folder's.
    """
    root = os.fspath(out)
    if not isinstance(part_bytes, int) or isinstance(part_bytes, bool) or part_bytes < 1:
        raise ValueError(f"part_bytes={part_bytes!r} must be an int >= 1 (bytes a part).")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed={seed!r} must be an int >= 0.")
    if executor not in ("local", "ray"):
        raise ValueError(f"executor={executor!r} must be 'local' or 'ray'.")
    if workers is not None and (
        not isinstance(workers, int) or isinstance(workers, bool) or workers < 0
    ):
        raise ValueError(f"workers={workers!r} must be an int >= 0 (0: this process alone).")
    if isinstance(images, ImageFolderSource):
        source = images
    elif isinstance(images, str | os.PathLike):
        source = ImageFolderSource(images, storage_options=storage_options)
    else:
        raise TypeError(
            f"images is a {type(images).__name__}; pass an image folder's path or URL, or "
            "an ImageFolderSource."
        )
    plan = _plan(source, part_bytes=part_bytes, shuffle=bool(shuffle), seed=seed)
    if len(plan["parts"]) > 99_999:  # part folders are numbered with five digits
        raise ValueError(
            f"part_bytes={part_bytes} cuts the images into {len(plan['parts']):,} parts, more "
            "than a folder holds (99,999); pass a larger part_bytes."
        )
    _start_record(root, plan, storage_options)
    todo = missing_parts(root, len(plan["parts"]), storage_options)
    init = {
        "plan": plan,
        "out": root,
        "storage_options": dict(storage_options or {}),
        "source": pickle.dumps(source),
        "path": list(sys.path),
    }
    count = min(os.cpu_count() or 1, len(todo)) if workers is None else min(workers, len(todo))
    start = time.perf_counter()
    with _Report(len(todo), show=progress) as report:
        if todo and executor == "ray":
            run_ray(todo, init, 1, report, task=ray_image_part)
        elif todo and count > 0:
            pool = start_workers(count, "images")
            try:
                run_local(pool, todo, init, report)
            finally:
                stop_workers(pool)
        elif todo:
            runner = ImagesRunner(init)
            for index in todo:
                message = runner(index, lambda n, b, i=index: report.progress(i, n, b))
                if message[0] == "error":
                    raise RuntimeError(f"part {index} of {root}: {message[2]}")
                report.done(index, message[2])
    seconds = time.perf_counter() - start
    status = _finish(root, plan, storage_options)
    return dataclasses.replace(
        status,
        ran=len(todo),
        seconds=seconds,
        images=report.counts["images"],
        image_bytes=report.counts["bytes"],
    )


def _plan(
    source: ImageFolderSource, *, part_bytes: int, shuffle: bool, seed: int
) -> dict[str, Any]:
    """The build: the folder's identity, the settings, and the parts (runs of positions
    in the written order), cut from the images' sizes alone."""
    n = len(source)
    sizes = source.sizes
    if shuffle and n:
        sizes = sizes[np.asarray(Permutation(n, seed=seed, epoch=0)(np.arange(n)), np.int64)]
    if n and (sizes >= 0).all():
        ends = np.cumsum(sizes)
        parts, start, base = [], 0, 0
        while start < n:  # each part at least one image, at most part_bytes beyond it
            stop = int(np.searchsorted(ends, base + part_bytes, side="right"))
            stop = max(stop, start + 1)
            parts.append([start, stop])
            base, start = int(ends[stop - 1]), stop
    else:
        parts = [[s, min(s + UNSIZED_PART, n)] for s in range(0, n, UNSIZED_PART)]
    return {
        "command": COMMAND,
        "images": {
            "root": source.root,
            "count": n,
            "classes": source.classes,
            "fingerprint": source.fingerprint,
        },
        "settings": {"part_bytes": part_bytes, "shuffle": shuffle, "seed": seed},
        "parts": parts,
    }


def _start_record(root: str, plan: dict[str, Any], options: Mapping[str, Any] | None) -> None:
    """Writes the build's record, or checks that the one there plans this same build."""
    if read_json(join(root, MANIFEST), options) is not None:
        raise FileExistsError(
            f"{join(root, MANIFEST)} exists: {root} holds a dataset written by write_source; "
            "shard the images into a new folder."
        )
    record = read_json(join(root, RECORD), options)
    if record is None:
        _write_record(root, {"format": RECORD_FORMAT, "plan": plan, "complete": None}, options)
        return
    old = record["plan"]
    differ = []
    if old.get("command") != COMMAND:
        differ.append(f"it was written by {old.get('command', 'meshfeed prepare')}")
    else:
        for key, value in plan["settings"].items():
            if old["settings"].get(key) != value:
                differ.append(f"{key}={value!r} now, {old['settings'].get(key)!r} when it started")
        if old["images"] != plan["images"]:
            differ.append(
                f"the images differ ({plan['images']['count']} now, "
                f"{old['images']['count']} when it started, or other files or classes)"
            )
    if differ:
        raise ValueError(
            f"{root} holds another build than this one: "
            + "; ".join(differ[:4])
            + ". Finish it with the same command, or shard into a new folder."
        )


def _write_record(root: str, record: dict[str, Any], options: Mapping[str, Any] | None) -> None:
    if not is_url(root):
        os.makedirs(root, exist_ok=True)
    FolderWriter(root, options).write(RECORD, json.dumps(record, indent=1).encode())


def _finish(root: str, plan: dict[str, Any], options: Mapping[str, Any] | None) -> ShardStatus:
    """The build's state; when every part is written, the record marked complete with
    every part's manifest as one catalog."""
    count = len(plan["parts"])
    folders = [part_folder(i, count) for i in range(count)]
    manifests = [(f, read_json(join(root, f, MANIFEST), options)) for f in folders]
    missing = [i for i, (_, m) in enumerate(manifests) if m is None]
    if not missing:
        images = sum(m["num_examples"] for _, m in manifests if m is not None)
        record = {
            "format": RECORD_FORMAT,
            "plan": plan,
            "complete": {"parts": count, "images": images},
            "catalog": merge_manifests(manifests),
        }
        _write_record(root, record, options)
    return ShardStatus(root, count, count - len(missing), missing, complete=not missing)
