"""Filters (README.md): ``meshfeed.select`` against a plain loop, a ``Loader`` over a
selection against one over the kept rows copied out, and a selection's bytes on disk.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from harness import arguments, emit, in_rounds, median_of, median_ratio, use_cpu_devices
from remote_fns import in_child

import meshfeed
from common import loader_batches, measure

DIRECTION = np.linspace(-1.0, 1.0, 32, dtype=np.float32)
PATTERN = re.compile(r"(?:-0\.\d*99|1\.\d*00)\d*")
EXAMPLES = [20_000, 200_000, 2_000_000]  # --smoke: the first


def threshold(record: dict[str, Any]) -> bool:
    return bool(record["score"] > 0.5)


def embedding(record: dict[str, Any]) -> bool:
    return bool(float(record["embedding"] @ DIRECTION) > 0.0)


def text(record: dict[str, Any]) -> bool:
    words = " ".join(f"{v:.6f}" for v in record["embedding"].tolist())
    return len(PATTERN.findall(words + " " + words.upper())) < 2  # keeps about 40%


PREDICATES = {"threshold": threshold, "embedding": embedding, "text": text}


def _loop(folder: str, keep: Callable[[dict[str, Any]], bool]) -> float:
    """Seconds of a plain loop: the arrays read whole, the predicate on every record."""
    began = time.perf_counter()
    score = np.load(f"{folder}/score.npy")
    vectors = np.load(f"{folder}/embedding.npy")
    kept = [i for i in range(len(score)) if keep({"score": score[i], "embedding": vectors[i]})]
    assert kept is not None
    return time.perf_counter() - began


def _select(source: Any, keep: Any, workers: int | None) -> float:
    with tempfile.TemporaryDirectory() as cache:
        began = time.perf_counter()
        meshfeed.select(source, keep, workers=workers, cache_dir=cache, progress=False)
        return time.perf_counter() - began


def source_of(folder: str) -> meshfeed.ArraySource:
    """The examples' arrays in ``folder``, memory-mapped."""
    arrays = {k: np.load(f"{folder}/{k}.npy", mmap_mode="r") for k in ("score", "embedding")}
    return meshfeed.ArraySource(arrays)


def select_cold(folder: str, predicate: str) -> float:
    """``_select`` on 2 workers in a fresh process: no worker rests from an earlier call
    (one call in this process alone first, so that what it imports is not timed)."""
    source = source_of(folder)
    _select(source, PREDICATES[predicate], 0)
    return _select(source, PREDICATES[predicate], 2)


def _select_part(args: argparse.Namespace, folder: str, common: dict[str, Any]) -> None:
    for n in EXAMPLES[:1] if args.smoke else EXAMPLES:
        rng = np.random.default_rng(0)
        np.save(f"{folder}/score.npy", rng.random(n, dtype=np.float32))
        np.save(f"{folder}/embedding.npy", rng.standard_normal((n, 32), dtype=np.float32))
        source = source_of(folder)
        _select(source, threshold, 2)  # a worker rests, as after any earlier call
        for name, keep in PREDICATES.items():
            entries = {
                "loop": partial(_loop, folder, keep),
                "select:2": partial(_select, source, keep, 2),
                "select:2 cold": partial(in_child, select_cold, folder, name),
                "select:auto": partial(_select, source, keep, None),
            }
            per_round = in_rounds(entries, args.rounds, pause=0)
            for entry in entries:
                line = {"workload": "select", "predicate": name, "name": entry, "examples": n}
                line["seconds"] = round(median_of(per_round, entry) or 0.0, 4)
                if entry != "loop":
                    line["ratio_to_loop"] = median_ratio(per_round, "loop", entry)
                emit("filters", **common, **line)


def _loader_part(args: argparse.Namespace, folder: str, common: dict[str, Any]) -> None:
    n = 16_384 if args.smoke else 262_144
    rng = np.random.default_rng(1)
    rows = rng.standard_normal((n, 64), dtype=np.float32)
    source = meshfeed.ArraySource({"x": rows, "score": rng.random(n, dtype=np.float32)})
    selection = meshfeed.select(source, threshold, workers=0, cache_dir=folder, progress=False)
    copied = meshfeed.ArraySource(
        {k: v[np.asarray(selection.kept)] for k, v in source[np.arange(n)].items()}
    )
    entries = {
        name: partial(measure, loader_batches(lambda src=src: src, 256), 256, args.seconds)
        for name, src in (("selection", selection), ("copied", copied))
    }
    per_round = in_rounds(entries, args.rounds, pause=0)
    for entry in ("selection", "copied"):
        line = {"workload": "loader", "name": entry, "kept": len(selection)}
        line["rows_per_s"] = round(median_of(per_round, entry) or 0.0)
        if entry == "selection":
            line["ratio_to_copied"] = median_ratio(per_round, "selection", "copied")
        emit("filters", **common, **line)
    meta = json.loads((Path(folder) / "selections" / selection.key / "selection.json").read_text())
    figures = {"examples": n, "kept": meta["kept"], "stored": meta["stored"]}
    figures["bytes_per_example"] = round(meta["bytes_per_example"], 3)
    emit("filters", **common, workload="bytes", name="selection", **figures)


def _add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-loader", action="store_true", help="the select part only")
    parser.add_argument("--no-select", action="store_true", help="the loader part only")


def main() -> None:
    use_cpu_devices()
    args = arguments(__doc__, seconds=1.0, rounds=7, add=_add_flags)
    common = {"smoke": args.smoke, "rounds": args.rounds, "cores": os.cpu_count()}
    with tempfile.TemporaryDirectory() as folder:
        if not args.no_select:
            _select_part(args, folder, common)
        if not args.no_loader:
            _loader_part(args, folder, common)


if __name__ == "__main__":
    main()
