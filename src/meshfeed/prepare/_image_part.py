"""A part of an image shard build: its images read from the folder, written as one shard.

A part is a run of positions in the build's order (the folder's images in a keyed
random order, or as listed); its images are read a chunk at a time (a URL's reads in
flight together), their bytes written unchanged as a ragged ``image`` field beside
``label`` and ``index`` (the image's id in the folder), and the part's manifest last,
so a part without one is unwritten. Runs in a bare worker process or a Ray task: no JAX.
"""

from __future__ import annotations

import pickle
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from meshfeed.core._permutation import Permutation
from meshfeed.data._folder import join, part_folder
from meshfeed.data._ragged import Ragged
from meshfeed.data._writer import FolderWriter, write_folder

CHUNK = 256
"""Images read together: a URL's reads go out at once, so a chunk is a round trip."""


def part_ids(plan: Mapping[str, Any], index: int) -> np.ndarray:
    """The folder ids of part ``index``'s images, in the order they are written."""
    start, stop = plan["parts"][index]
    positions = np.arange(start, stop, dtype=np.int64)
    settings = plan["settings"]
    if not settings["shuffle"]:
        return positions
    order = Permutation(plan["images"]["count"], seed=settings["seed"], epoch=0)
    return np.asarray(order(positions), np.int64)


def write_image_part(
    index: int,
    plan: Mapping[str, Any],
    source: Any,
    out: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, int]:
    """Writes part ``index`` under ``out``; returns its counts (``images``, ``bytes``)."""
    ids = part_ids(plan, index)
    images: list[Ragged] = []
    labels: list[np.ndarray] = []
    done = size = 0
    for start in range(0, len(ids), CHUNK):
        chunk = source[ids[start : start + CHUNK]]
        images.append(chunk["image"])
        if "label" in chunk:
            labels.append(np.asarray(chunk["label"], np.int64))
        done += len(chunk["image"])
        size += int(chunk["image"].values.nbytes)
        if progress is not None:
            progress(done, size)
    shard: dict[str, Any] = {"image": Ragged.concat(images)}
    if labels:
        shard["label"] = np.concatenate(labels)
    shard["index"] = ids
    count = len(plan["parts"])
    writer = FolderWriter(join(out, part_folder(index, count)), storage_options)
    extra = {"images": {"classes": plan["images"]["classes"]}}
    write_folder(writer, [shard], extra=extra, allow_empty=False)
    return {"images": done, "bytes": size}


class ImagesRunner:
    """Writes parts of one build (its source unpickled once per process)."""

    def __init__(self, init: dict[str, Any]) -> None:
        self.plan = init["plan"]
        self.out = init["out"]
        self.storage_options = init["storage_options"]
        self.source = pickle.loads(init["source"])

    def __call__(self, index: int, progress: Any = None) -> tuple[Any, ...]:
        try:
            counts = write_image_part(
                index,
                self.plan,
                self.source,
                self.out,
                storage_options=self.storage_options,
                progress=progress,
            )
        except Exception as error:
            return ("error", index, f"{type(error).__name__}: {error}\n{traceback.format_exc()}")
        return ("done", index, counts)


_RUNNERS: dict[str, ImagesRunner] = {}


def ray_image_part(init: dict[str, Any], index: int) -> tuple[Any, ...]:
    """One part, in a Ray worker (which keeps the build's source for its next part)."""
    if init["out"] not in _RUNNERS:
        _RUNNERS.clear()
        _RUNNERS[init["out"]] = ImagesRunner(init)
    return _RUNNERS[init["out"]](index)
