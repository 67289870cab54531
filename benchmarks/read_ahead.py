"""The default read-ahead in many fresh processes: one mode, as fast as the best fixed depth.

Workload H: 50,000 CIFAR-shaped rows (32x32x3 uint8) and an int32 label, global batch
512, 8 CPU devices, ``per_process``, no workers, every default as it is; shuffled. Its
sources:

- ``memory``: the arrays in memory, an ``ArraySource``;
- ``mmap``: the same arrays in ``.npy`` files opened with ``mmap_mode="r"``;
- ``folder``: the same arrays written by ``meshfeed.write_source`` and opened with
  ``meshfeed.open_source``;
- ``records``: 16,384 PNG-encoded 32x32 images decoded and cropped per record by 2
  worker processes (workload C's record transform, global batch 256): the read-ahead
  whose depth grows to feed the workers.

Each process is fresh (a new interpreter: the read-ahead starts from nothing, as in a
user's job) and times, after 300 steps of warm-up each (100 for ``records``), the
default loader (``prefetch="auto"``), fixed depths (``prefetch=0, 1, 2, 16``; 0 reads in
the loop, no thread), and a
second ``prefetch=1`` loader whose ratio to the first is the measurement's own noise:
``noise``) and the floor (a numpy gather of the same ids from the same arrays, then
``make_array_from_process_local_data``; none for ``records``) in rounds whose order
rotates, each window at least ``--seconds``, after twice the contender's depth of steps
untimed (what it read ahead while the others ran is not that window's work).
``--default-only`` times the default and the floor alone (the protocol issue 49 was
found with); ``--src`` times another build's meshfeed (``git worktree add``).

A process's line: each contender's median rows/s, the default's median per-round ratio
to the floor and to the best fixed depth, and where the default ended with its last
moves. A summary per source: the default's rows/s and its ratio to the floor over the
processes (min, median, max), the worst process's against the median for both (goal:
>= 0.8, no second mode); the default against the best fixed depth (goal: >= 0.95); the
depths it ended at.

Prints one JSON line per process and one summary per source; ``--smoke`` for CI.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
SOURCES = ("memory", "mmap", "folder", "records")
FIXED = (0, 1, 2, 16)
BATCH, RECORDS_BATCH = 512, 256


def _arrays(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "image": rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8),
        "label": rng.integers(0, 10, n, dtype=np.int32),
    }


def _data(kind: str, n: int, folder: Path) -> tuple[Any, dict[str, np.ndarray] | None]:
    """The loader's source and the floor's arrays (``None``: no floor)."""
    import meshfeed

    if kind == "records":
        from decode_fns import encode_all

        encoded, labels = encode_all(n)
        return meshfeed.ArraySource({"png": encoded, "label": labels}), None
    arrays = _arrays(n)
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
                source, global_batch_size=batch, sharding=sharding, num_epochs=None,
                prefetch=p, **extra,  # type: ignore[arg-type]
            )
            for name, p in depths.items()
        }  # fmt: skip
        steps: dict[str, Callable[[], Any]] = {}
        for name, loader in loaders.items():
            it = iter(loader)
            steps[name] = it.__next__
        if floor_arrays is not None:
            steps["floor"] = _floor(floor_arrays, batch, sharding)
        for step in steps.values():
            for _ in range(warmup):
                jax.block_until_ready(step())
        names = list(steps)
        rates: dict[str, list[float]] = {name: [] for name in names}
        for r in range(rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                # Steps read ahead while the others ran are not this window's work: take
                # twice the depth first (a deep read-ahead of record workers' rows would
                # otherwise start each window with a head start).
                loader = loaders.get(name)
                for _ in range(4 + 2 * (loader.prefetch_depth if loader is not None else 0)):
                    jax.block_until_ready(steps[name]())
                rates[name].append(_window(steps[name], batch, seconds))
        auto = loaders["auto"]
        stats = auto.stats()["consumer"]["read_ahead"]  # "moves": none before issue 49's build
        line: dict[str, Any] = {
            "rows_per_s": {k: round(statistics.median(v)) for k, v in rates.items()},
            "depth": auto.prefetch_depth,
            "moves": stats.get("moves", [])[-4:],
        }
        if fixed:
            best = max(map(str, fixed), key=lambda k: statistics.median(rates[k]))
            line["best_fixed"] = int(best)
            line["ratio_to_best_fixed"] = _ratio(rates["auto"], rates[best])
            line["noise"] = _ratio(rates["1 again"], rates["1"])  # identical contenders
        if "floor" in rates:
            line["ratio_to_floor"] = _ratio(rates["auto"], rates["floor"])
            for p in fixed:
                line[f"prefetch={p}_ratio_to_floor"] = _ratio(rates[str(p)], rates["floor"])
        for loader in loaders.values():
            loader.close()
        return line


def _ratio(a: list[float], b: list[float]) -> float:
    return round(statistics.median(x / y for x, y in zip(a, b, strict=True)), 3)


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


def _window(step: Callable[[], Any], batch: int, seconds: float) -> float:
    import jax

    done, start = 0, time.perf_counter()
    while True:
        jax.block_until_ready(step())
        done += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return done * batch / elapsed


def _summary(kind: str, lines: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"source": kind, "processes": len(lines)}
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny data and timings, for CI")
    parser.add_argument("--processes", type=int, default=20, help="fresh processes a source")
    parser.add_argument("--sources", default=",".join(SOURCES))
    parser.add_argument("--seconds", type=float, default=0.3, help="each timed window")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument(
        "--default-only", action="store_true", help="the default and the floor alone"
    )
    parser.add_argument("--src", help="time the meshfeed in this folder (another build's src)")
    parser.add_argument("--label", default="", help="a label on every line (which build)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    smoke = args.smoke
    if args.child:  # JAX and meshfeed are imported from here on, with 8 CPU devices
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
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
    head = {"benchmark": "read_ahead", "workload": "H", "label": args.label}
    for kind in args.sources.split(","):
        lines = []
        for p in range(processes):
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind, *tail]
            out = subprocess.run(
                cmd, capture_output=True, text=True, cwd=HERE, env=env, check=False
            )
            if out.returncode != 0:
                sys.exit(f"{kind} process {p} failed:\n{out.stderr[-3000:]}")
            line = json.loads(out.stdout.strip().splitlines()[-1])
            lines.append(line)
            print(json.dumps({**head, "source": kind, "process": p, **line}), flush=True)
        summary = {**head, "name": f"summary:{kind}", **_summary(kind, lines), "smoke": smoke}
        summary.update(jax=_jax_version(), python=platform.python_version())
        print(json.dumps(summary), flush=True)


def _jax_version() -> str:
    from importlib.metadata import version

    return version("jax")


if __name__ == "__main__":
    main()
