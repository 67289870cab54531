"""Filters: ``meshfeed.select`` against a plain loop, a loader over a selection against
one over the kept rows copied out, and what a selection costs on disk.

- ``select``: 20,000, 200,000 and 2,000,000 examples (``--examples``) in ``.npy`` files
  read as memory maps (a score, and a 32-float embedding), three predicates:
  ``threshold`` (``score > 0.5``: the cheapest there is, ~0.15 us a record),
  ``embedding`` (the embedding's dot product with a direction above 0: ~1 us) and
  ``text`` (the embedding written out as text and searched with a regular expression, as
  a quality or language filter over text is: ~20 us). Entries, each timed once a round
  in an order that rotates, each with an empty cache: ``loop`` (one process calls the
  predicate on every record, the arrays read whole first), ``select:2`` (``workers=2``:
  this process and one worker, which rests from an earlier call as it does for 60 s
  after each), ``select:2 cold`` (the same with no worker resting: one starts, ~0.1 s,
  while this process writes the first parts), ``select:auto`` (``workers=None``: a
  process a core). Seconds; ratios are the loop's time over the entry's.
- ``loader``: 262,144 examples of 64 float32, half of them kept; a ``Loader`` (batch 256,
  8 CPU devices, shuffled, endless, no training) over the selection against one over
  the kept rows copied into a source of their own: rows/s in windows of at least 0.3 s.
- ``bytes``: the selection's file over the source's examples.

Medians over rounds; ratios are medians of per-round ratios. One JSON line per entry;
``--smoke`` for CI.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import importlib
import json
import platform
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

import meshfeed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import measure

DIRECTION = np.linspace(-1.0, 1.0, 32, dtype=np.float32)


def threshold(record: dict[str, Any]) -> bool:
    return bool(record["score"] > 0.5)


def embedding(record: dict[str, Any]) -> bool:
    return bool(float(record["embedding"] @ DIRECTION) > 0.0)


PATTERN = re.compile(r"(?:-0\.\d*99|1\.\d*00)\d*")


def text(record: dict[str, Any]) -> bool:
    words = " ".join(f"{v:.6f}" for v in record["embedding"].tolist())
    return len(PATTERN.findall(words + " " + words.upper())) < 2  # keeps about 40%


PREDICATES: dict[str, Callable[[dict[str, Any]], bool]] = {
    "threshold": threshold,
    "embedding": embedding,
    "text": text,
}


def _data(folder: str, n: int) -> meshfeed.ArraySource:
    rng = np.random.default_rng(0)
    np.save(f"{folder}/score.npy", rng.random(n, dtype=np.float32))
    np.save(f"{folder}/embedding.npy", rng.standard_normal((n, 32), dtype=np.float32))
    return meshfeed.ArraySource(
        {name: np.load(f"{folder}/{name}.npy", mmap_mode="r") for name in ("score", "embedding")}
    )


def _loop(folder: str, keep: Callable[[dict[str, Any]], bool]) -> float:
    """Seconds of a plain loop: the arrays read whole, the predicate on every record."""
    began = time.perf_counter()
    score, vectors = np.load(f"{folder}/score.npy"), np.load(f"{folder}/embedding.npy")
    kept = [i for i in range(len(score)) if keep({"score": score[i], "embedding": vectors[i]})]
    assert kept is not None
    return time.perf_counter() - began


def _select(
    source: meshfeed.ArraySource, keep: Any, workers: int | None, cold: bool = False
) -> float:
    if cold:  # no worker resting from an earlier call
        importlib.import_module("meshfeed.prepare._select")._RESTING.close()
    with tempfile.TemporaryDirectory() as cache:
        began = time.perf_counter()
        meshfeed.select(source, keep, workers=workers, cache_dir=cache, progress=False)
        return time.perf_counter() - began


def _select_part(args: argparse.Namespace, folder: str, common: dict[str, Any]) -> None:
    for n in [20_000] if args.smoke else [int(x) for x in args.examples.split(",")]:
        _select_size(args, folder, common, n)


def _select_size(args: argparse.Namespace, folder: str, common: dict[str, Any], n: int) -> None:
    source = _data(folder, n)
    _select(source, threshold, 2)  # a worker rests, as after any earlier call
    chosen = args.predicates.split(",")
    for name, keep in [(k, v) for k, v in PREDICATES.items() if k in chosen]:
        entries = {
            "loop": lambda keep=keep: _loop(folder, keep),
            "select:2": lambda keep=keep: _select(source, keep, 2),
            "select:2 cold": lambda keep=keep: _select(source, keep, 2, cold=True),
            "select:auto": lambda keep=keep: _select(source, keep, None),
        }
        names = list(entries)
        rounds: list[dict[str, float]] = []
        for r in range(args.rounds):
            k = r % len(names)
            rounds.append({e: entries[e]() for e in names[k:] + names[:k]})
        for entry in names:
            line = {
                **common,
                "workload": "select",
                "predicate": name,
                "name": entry,
                "examples": n,
                "seconds": round(statistics.median(x[entry] for x in rounds), 4),
            }
            if entry != "loop":
                ratios = [x["loop"] / x[entry] for x in rounds]
                line["ratio_to_loop"] = round(statistics.median(ratios), 3)
            print(json.dumps(line), flush=True)


def _loader_part(args: argparse.Namespace, folder: str, common: dict[str, Any]) -> None:
    n = 16_384 if args.smoke else 262_144
    rng = np.random.default_rng(1)
    rows = rng.standard_normal((n, 64), dtype=np.float32)
    source = meshfeed.ArraySource({"x": rows, "score": rng.random(n, dtype=np.float32)})
    selection = meshfeed.select(source, threshold, workers=0, cache_dir=folder, progress=False)
    copied = meshfeed.ArraySource(
        {k: v[np.asarray(selection.kept)] for k, v in source[np.arange(n)].items()}
    )
    sharding = meshfeed.batch_sharding(meshfeed.make_mesh(data=jax.device_count()))

    def run(src: Any) -> Callable[[], Any]:
        return lambda: iter(
            meshfeed.Loader(src, global_batch_size=256, sharding=sharding, num_epochs=None)
        )

    entries = {"selection": run(selection), "copied": run(copied)}
    names, rounds = list(entries), []
    seconds = 0.3 if args.smoke else args.seconds
    for r in range(args.rounds):
        rounds.append(
            {e: measure(entries[e], 256, seconds) for e in names[r % 2 :] + names[: r % 2]}
        )
    ratio = statistics.median(x["selection"] / x["copied"] for x in rounds)
    for entry in names:
        line = {
            **common,
            "workload": "loader",
            "name": entry,
            "kept": len(selection),
            "rows_per_s": round(statistics.median(x[entry] for x in rounds)),
        }
        if entry == "selection":
            line["ratio_to_copied"] = round(ratio, 3)
        print(json.dumps(line), flush=True)
    meta = json.loads((Path(folder) / "selections" / selection.key / "selection.json").read_text())
    print(
        json.dumps(
            {
                **common,
                "workload": "bytes",
                "name": "selection",
                "examples": n,
                "kept": meta["kept"],
                "stored": meta["stored"],
                "bytes_per_example": round(meta["bytes_per_example"], 3),
            }
        ),
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny data and timings, for CI")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=1.0, help="a loader's window")
    parser.add_argument("--examples", default="20000,200000,2000000", help="comma-separated")
    parser.add_argument("--predicates", default=",".join(PREDICATES), help="comma-separated")
    parser.add_argument("--no-loader", action="store_true", help="the select part only")
    parser.add_argument("--no-select", action="store_true", help="the loader part only")
    args = parser.parse_args()
    if args.smoke:
        args.rounds = 1
    common = {
        "benchmark": "filters",
        "rounds": args.rounds,
        "cores": os.cpu_count(),
        "smoke": args.smoke,
        "jax": jax.__version__,
        "python": platform.python_version(),
    }
    with tempfile.TemporaryDirectory() as folder:
        if not args.no_select:
            _select_part(args, folder, common)
        if not args.no_loader:
            _loader_part(args, folder, common)


if __name__ == "__main__":
    main()
