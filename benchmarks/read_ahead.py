"""Workload H, in fresh processes: the default read-ahead against fixed depths and the floor."""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import jax
import numpy as np
from decode_fns import decode_crop, encode_all
from harness import arguments, emit, in_rounds, median_of, median_ratio
from remote_fns import in_child, loader
from workload_fns import images

import meshfeed
from common import measure, to_global

SOURCES = ("memory", "mmap", "folder", "records")
FIXED = (0, 1, 2, 16)
BATCH, RECORDS_BATCH = 512, 256


def _data(kind: str, n: int, folder: Path) -> tuple[Any, dict[str, np.ndarray] | None]:
    """The loader's source and the floor's arrays (``None``: no floor)."""
    if kind == "records":
        encoded, labels = encode_all(n)
        return meshfeed.ArraySource({"png": encoded, "label": labels}), None
    arrays = images(n)
    if kind == "memory":
        return meshfeed.ArraySource(arrays), arrays
    for name, a in arrays.items():
        np.save(folder / f"{name}.npy", a)
    mapped = {name: np.load(folder / f"{name}.npy", mmap_mode="r") for name in arrays}
    if kind == "mmap":
        return meshfeed.ArraySource(mapped), mapped
    meshfeed.write_source(folder / "data", arrays, shard_size=8192)
    return meshfeed.open_source(folder / "data"), mapped


def _floor(arrays: dict[str, np.ndarray], batch: int) -> Iterator[Any]:
    """The floor's batches: a numpy gather of shuffled ids, endless, then global arrays."""
    order = np.random.default_rng(0).permutation(len(arrays["label"]))
    ids = [order[i * batch : (i + 1) * batch] for i in range(len(order) // batch)]
    return to_global(({k: a[r] for k, a in arrays.items()} for r in itertools.cycle(ids)), batch)


def _child(kind: str, n: int, seconds: float, rounds: int, warmup: int, fixed: list[int]):
    batch = RECORDS_BATCH if kind == "records" else BATCH
    extra = {"record_transform": decode_crop, "num_workers": 2} if kind == "records" else {}
    with tempfile.TemporaryDirectory() as tmp:
        source, floor_arrays = _data(kind, n, Path(tmp))
        # "1 again": a second prefetch=1 loader; its ratio to "1" is a process's noise
        depths: dict[str, int | str] = {"auto": "auto", **{str(p): p for p in fixed}}
        if fixed:
            depths["1 again"] = 1
        loaders = {name: loader(source, batch, prefetch=p, **extra) for name, p in depths.items()}
        steps: dict[str, Callable[[], Any]] = {n: iter(x).__next__ for n, x in loaders.items()}
        if floor_arrays is not None:  # the same gather, then global arrays
            steps["floor"] = _floor(floor_arrays, batch).__next__
        for step in steps.values():
            for _ in range(warmup):
                jax.block_until_ready(step())

        def window(name: str) -> float:
            # Steps read ahead while the others ran are not this window's work: take twice
            # the depth first (else a deep read-ahead of record workers' rows gets ahead).
            fed = loaders.get(name)
            skip = 4 + 2 * (fed.prefetch_depth if fed is not None else 0)
            return measure(lambda: iter(steps[name], None), batch, seconds, warmup=skip)

        per_round = in_rounds({n: partial(window, n) for n in steps}, rounds, pause=0.0)
        auto = loaders["auto"]
        moves = auto.stats()["consumer"]["read_ahead"].get("moves", [])  # none before issue 49
        line = {"rows_per_s": {n: round(median_of(per_round, n) or 0.0) for n in steps}}
        line |= {"depth": auto.prefetch_depth, "moves": moves[-4:]}
        if fixed:
            best = max(map(str, fixed), key=lambda k: median_of(per_round, k) or 0)
            line["best_fixed"] = int(best)
            line["ratio_to_best_fixed"] = median_ratio(per_round, "auto", best)
            line["noise"] = median_ratio(per_round, "1 again", "1")
        if "floor" in steps:
            line["ratio_to_floor"] = median_ratio(per_round, "auto", "floor")
            for p in fixed:
                line[f"prefetch={p}_ratio_to_floor"] = median_ratio(per_round, str(p), "floor")
        for x in loaders.values():
            x.close()
        return line


def _spread(values: list[float], digits: int | None, most: bool = True) -> dict[str, Any]:
    """The least, the median (rounded) and, with ``most``, the most of ``values``."""
    out = {"min": min(values), "median": round(statistics.median(values), digits)}
    return {**out, "max": max(values)} if most else out


def _summary(kind: str, lines: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"source": kind}
    if "ratio_to_best_fixed" in lines[0]:
        for key in ("ratio_to_best_fixed", "noise"):
            out[key] = _spread([x[key] for x in lines], 3, most=False)
    out["depths"] = sorted(x["depth"] for x in lines)
    rates = [x["rows_per_s"]["auto"] for x in lines]
    out["rows_per_s"] = _spread(rates, None)
    out["worst_rate_against_median"] = round(min(rates) / statistics.median(rates), 3)
    if "ratio_to_floor" in lines[0]:
        floor = [x["ratio_to_floor"] for x in lines]
        out["ratio_to_floor"] = _spread(floor, 3)
        out["worst_against_median"] = round(min(floor) / statistics.median(floor), 3)
    return out


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--processes", type=int, default=20, help="fresh processes a source")
    parser.add_argument("--sources", default=",".join(SOURCES))
    parser.add_argument("--default-only", action="store_true", help="the default and the floor")
    parser.add_argument("--src", help="time the meshfeed in this folder (another build's src)")
    parser.add_argument("--label", default="", help="a label on every line (which build)")


def main() -> None:
    smoke = {"seconds": 0.05, "rounds": 1, "processes": 1}
    args = arguments(__doc__, seconds=0.3, rounds=9, smoke=smoke, add=_flags)
    fixed = () if args.default_only else FIXED
    head = {"workload": "H", "label": args.label, "smoke": args.smoke}
    head |= {"devices": 8, "processes": args.processes}  # fresh processes a source, 8 devices each
    for kind in args.sources.split(","):
        n = {True: (2_048, 8_192), False: (16_384, 50_000)}[args.smoke][kind != "records"]
        warmup = 5 if args.smoke else (100 if kind == "records" else 300)
        run = (kind, n, args.seconds, args.rounds, warmup, fixed)
        lines = []
        for p in range(args.processes):
            lines.append(in_child(_child, *run, src=args.src))
            emit("read_ahead", **head, source=kind, process=p, **lines[-1])
        emit("read_ahead", **head, name=f"summary:{kind}", **_summary(kind, lines))


if __name__ == "__main__":
    main()
