"""The default read-ahead in many fresh processes: one mode, as fast as the best fixed depth.

Workload H: ``prefetch="auto"`` against ``prefetch=0, 1, 2, 16`` and the floor (a numpy
gather + ``make_array_from_process_local_data``) over each source, each process fresh,
rotating rounds. Goals: the worst process >= 0.8x the median, >= 0.95x the best fixed
depth. ``--default-only`` times the default and the floor alone; ``--src`` another build.
``--smoke`` for CI; the workload is in ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from harness import arguments, emit, in_rounds, median_of, median_ratio, run_child, use_cpu_devices
from workload_fns import images

from common import measure

SOURCES = ("memory", "mmap", "folder", "records")
FIXED = (0, 1, 2, 16)
BATCH, RECORDS_BATCH = 512, 256


def _data(kind: str, n: int, folder: Path) -> tuple[Any, dict[str, np.ndarray] | None]:
    """The loader's source and the floor's arrays (``None``: no floor)."""
    import meshfeed

    if kind == "records":
        from decode_fns import encode_all

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


def _child(
    kind: str, n: int, seconds: float, rounds: int, warmup: int, fixed: tuple[int, ...]
) -> dict[str, Any]:
    import jax

    import meshfeed

    sharding = meshfeed.batch_sharding(meshfeed.make_mesh(data=8))
    batch = RECORDS_BATCH if kind == "records" else BATCH
    with tempfile.TemporaryDirectory() as tmp:
        source, floor_arrays = _data(kind, n, Path(tmp))
        extra: dict[str, Any] = {}
        if kind == "records":
            from decode_fns import decode_crop

            extra = {"record_transform": decode_crop, "num_workers": 2}
        # "1 again": a second prefetch=1 loader, whose ratio to the first is the noise of
        # a process's measurement (two identical contenders).
        depths: dict[str, int | str] = {"auto": "auto", **{str(p): p for p in fixed}}
        if fixed:
            depths["1 again"] = 1
        loaders = {
            name: meshfeed.Loader(
                source,
                global_batch_size=batch,
                sharding=sharding,
                num_epochs=None,
                prefetch=p,
                **extra,
            )
            for name, p in depths.items()
        }
        steps: dict[str, Callable[[], Any]] = {n: iter(x).__next__ for n, x in loaders.items()}
        if floor_arrays is not None:
            steps["floor"] = _floor(floor_arrays, batch, sharding)
        for step in steps.values():
            for _ in range(warmup):
                jax.block_until_ready(step())

        def window(name: str) -> float:
            # Steps read ahead while the others ran are not this window's work: take twice
            # the depth first (a deep read-ahead of record workers' rows would otherwise
            # start each window with a head start).
            loader = loaders.get(name)
            for _ in range(4 + 2 * (loader.prefetch_depth if loader is not None else 0)):
                jax.block_until_ready(steps[name]())
            return measure(lambda: iter(steps[name], None), batch, seconds, warmup=0)

        per_round = in_rounds({n: partial(window, n) for n in steps}, rounds, pause=0.0)
        auto = loaders["auto"]
        stats = auto.stats()["consumer"]["read_ahead"]  # "moves": none before issue 49's build
        line: dict[str, Any] = {
            "rows_per_s": {k: round(median_of(per_round, k) or 0) for k in steps},
            "depth": auto.prefetch_depth,
            "moves": stats.get("moves", [])[-4:],
        }
        if fixed:
            best = max(map(str, fixed), key=lambda k: median_of(per_round, k) or 0)
            line["best_fixed"] = int(best)
            line["ratio_to_best_fixed"] = median_ratio(per_round, "auto", best)
            line["noise"] = median_ratio(per_round, "1 again", "1")  # identical contenders
        if "floor" in steps:
            line["ratio_to_floor"] = median_ratio(per_round, "auto", "floor")
            for p in fixed:
                line[f"prefetch={p}_ratio_to_floor"] = median_ratio(per_round, str(p), "floor")
        for loader in loaders.values():
            loader.close()
        return line


def _floor(arrays: dict[str, np.ndarray], batch: int, sharding: Any) -> Callable[[], Any]:
    import jax

    n = len(arrays["label"])
    order = np.random.default_rng(0).permutation(n)
    ids = [order[i * batch : (i + 1) * batch] for i in range(n // batch)]
    k = iter(range(1 << 62))

    def step() -> Any:
        rows = ids[next(k) % len(ids)]
        return {
            name: jax.make_array_from_process_local_data(sharding, a[rows], (batch, *a.shape[1:]))
            for name, a in arrays.items()
        }

    return step


def _summary(kind: str, lines: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"source": kind}
    if "ratio_to_best_fixed" in lines[0]:
        best = [x["ratio_to_best_fixed"] for x in lines]
        out["ratio_to_best_fixed"] = {"min": min(best), "median": round(statistics.median(best), 3)}
        noise = [x["noise"] for x in lines]
        out["noise"] = {"min": min(noise), "median": round(statistics.median(noise), 3)}
    out["depths"] = sorted(x["depth"] for x in lines)
    rates = [x["rows_per_s"]["auto"] for x in lines]
    mid = statistics.median(rates)
    out["rows_per_s"] = {"min": min(rates), "median": round(mid), "max": max(rates)}
    out["worst_rate_against_median"] = round(min(rates) / mid, 3)
    if "ratio_to_floor" in lines[0]:
        floor = [x["ratio_to_floor"] for x in lines]
        mid = statistics.median(floor)
        out["ratio_to_floor"] = {"min": min(floor), "median": round(mid, 3), "max": max(floor)}
        out["worst_against_median"] = round(min(floor) / mid, 3)
    return out


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--processes", type=int, default=20, help="fresh processes a source")
    parser.add_argument("--sources", default=",".join(SOURCES))
    parser.add_argument("--default-only", action="store_true", help="the default and the floor")
    parser.add_argument("--src", help="time the meshfeed in this folder (another build's src)")
    parser.add_argument("--label", default="", help="a label on every line (which build)")
    parser.add_argument("--child", help=argparse.SUPPRESS)


def main() -> None:
    use_cpu_devices()  # for the children: JAX starts in them only
    args = arguments(__doc__, seconds=0.3, rounds=9, smoke={}, add=_flags)
    smoke = args.smoke
    if args.child:
        kind = args.child
        n = {True: (2_048, 8_192), False: (16_384, 50_000)}[smoke][kind != "records"]
        warmup = 5 if smoke else (100 if kind == "records" else 300)
        fixed = () if args.default_only else FIXED
        seconds, rounds = (0.05, 1) if smoke else (args.seconds, args.rounds)
        line = _child(kind, n, seconds, rounds, warmup, fixed)
        print(json.dumps(line), flush=True)
        return
    processes = 1 if smoke else args.processes
    tail = ["--seconds", str(args.seconds), "--rounds", str(args.rounds)]
    tail += ["--smoke"] if smoke else []
    tail += ["--default-only"] if args.default_only else []
    env = dict(os.environ)
    if args.src:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.src, env.get("PYTHONPATH")]))
    head = {"workload": "H", "label": args.label, "smoke": smoke}
    head |= {"devices": 8, "processes": processes}  # fresh processes a source, 8 devices each
    for kind in args.sources.split(","):
        lines = []
        for p in range(processes):
            line = run_child([__file__, "--child", kind, *tail], env=env)
            lines.append(line)
            emit("read_ahead", **head, source=kind, process=p, **line)
        summary = _summary(kind, lines)
        emit("read_ahead", **head, name=f"summary:{kind}", **summary)


if __name__ == "__main__":
    main()
