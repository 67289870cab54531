"""Record workers on Ray: against worker processes, the loading process's CPU, scaling.

One local Ray (``ray.init(address="local", num_cpus=16)``, replies up to 8 MiB inline,
as a local Ray the loader starts has them) that every ``worker_type="ray"`` loader
joins; global batch 256 on 8 CPU devices, endless. Part C: workload C's PNG decode on
``ray:2`` against ``processes:2``, records/s and the loading process's CPU per batch
(goal: ``ratio_to_processes`` >= 0.8). Part S: a record transform that sleeps 2 ms then
crops, on W = 1, 2, 4, ... 32 Ray workers: speedup over 1 worker and efficiency
(goal >= 0.8 until the loading side saturates), with the CPU of the loading process,
of Ray's own processes and of the workers. Rotating rounds, medians of per-round
ratios; README.md says more. ``--smoke`` (W = 1, 2) for CI.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import jax
import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_fns import decode_crop, encode_all
from harness import arguments, emit, in_rounds, use_cpu_devices
from ray_fns import SLEEP_S, images, sleep_crop

import meshfeed

BATCH = 256
RAY_CPUS = 16  # logical CPUs of the local Ray: room for all of S's workers at once
SCALING_CPUS = 0.25  # what each of S's workers reserves
SCALING_PREFETCH = 8
IDLE_AFTER_S = 3.0  # before the idle CPU is measured: every read-ahead full by then
GOAL_RATIO = 0.8
GOAL_EFFICIENCY = 0.8

# JAX warns on every os.fork() once it is initialised; Ray's start-up forks. Harmless.
warnings.filterwarnings("ignore", message=r".*os\.fork\(\).*", category=RuntimeWarning)


_OUT = sys.stdout  # the JSON lines; Ray's own messages go to stderr (``main``)


def _emit(line: dict[str, Any]) -> None:
    emit("ray_workers", stream=_OUT, **line)


def _start_ray() -> Any:
    import ray

    ray.init(
        address="local",
        num_cpus=RAY_CPUS,
        include_dashboard=False,
        log_to_driver=False,  # the actors' output would land among the JSON lines
        # What a local Ray the loader starts itself has, and the cluster guide gives a
        # cluster (ray start --system-config): chunks come back inline, not through the
        # object store, whose bookkeeping cost more CPU than the copy (0.69x -> 0.83x).
        _system_config={"max_direct_call_object_size": 8 << 20},
    )
    return ray


class _Entry:
    """A loader built once, its endless iterator, and its record workers' pids."""

    def __init__(self, name: str, make: Callable[[], meshfeed.Loader], workers: int) -> None:
        """Builds the loader, takes its first batches, and waits for its ``workers``."""
        before = {p for p, (kind, _) in _descendants().items() if kind == "worker"}
        start = time.perf_counter()
        self.name = name
        self.loader = make()
        self.it: Iterator[Any] = iter(self.loader)
        for _ in range(3):
            self.next()
        deadline = time.monotonic() + 120
        while True:  # the workers still starting (the batches went to the first ones)
            now = {p for p, (kind, _) in _descendants().items() if kind == "worker"}
            self.pids = now - before
            if len(self.pids) >= workers or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.start_s = round(time.perf_counter() - start, 2)

    def next(self) -> None:
        jax.block_until_ready(next(self.it))

    def close(self) -> None:
        self.loader.close()


def _loader(
    source: dict[str, np.ndarray], fn: Any, workers: int, worker_type: Any, **options: Any
) -> Callable[[], meshfeed.Loader]:
    return lambda: meshfeed.Loader(
        meshfeed.ArraySource(source),
        global_batch_size=BATCH,
        sharding=meshfeed.batch_sharding(meshfeed.make_mesh(data=8)),
        record_transform=fn,
        num_workers=workers,
        worker_type=worker_type,
        seed=0,
        num_epochs=None,
        **options,
    )


def _descendants() -> dict[int, tuple[str, float]]:
    """This process's descendants: pid -> ``"ray"`` (Ray's own: GCS, raylet, agents,
    idle workers) or ``"worker"`` (a record worker: a Ray actor, or one of meshfeed's
    worker processes), and its CPU seconds so far."""
    out = {}
    for child in psutil.Process().children(recursive=True):
        try:
            name = child.name()
            times = child.cpu_times()
            ray_own = not name.startswith("ray::RecordWorker") and (
                name.startswith("ray::")
                or name in ("gcs_server", "raylet")
                or any("/ray/" in part for part in child.cmdline()[1:3])
            )
        except psutil.Error:
            continue
        out[child.pid] = ("ray" if ray_own else "worker", times.user + times.system)
    return out


def _spent(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], own: set[int]
) -> dict[str, float]:
    """CPU seconds between two ``_descendants``: Ray's own, the ``own`` workers, the
    other record workers (the other entries', idle)."""
    out = {"ray_system": 0.0, "workers": 0.0, "other_workers": 0.0}
    for pid, (kind, cpu) in after.items():
        group = "ray_system" if kind == "ray" else "workers" if pid in own else "other_workers"
        out[group] += cpu - before.get(pid, (kind, 0.0))[1]
    return out


def _window(entry: _Entry, seconds: float) -> dict[str, float]:
    """Records/s of ``entry`` over ``seconds`` (at least 2 batches), after taking the
    batches its read-ahead may hold and 2 more; the CPU spent meanwhile."""
    for _ in range((entry.loader.prefetch_depth or 0) + 2):
        entry.next()
    before = _descendants()
    batches = 0
    cpu = time.process_time()
    start = time.perf_counter()
    while True:
        entry.next()
        batches += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and batches >= 2:
            break
    loader = time.process_time() - cpu
    spent = _spent(before, _descendants(), entry.pids)  # its scans: not the loader's CPU
    return {
        "rate": batches * BATCH / elapsed,
        "loader_cpu_ms_per_batch": 1000 * loader / batches,
        "ray_system_cpu_ms_per_batch": 1000 * spent["ray_system"] / batches,
        "worker_cpu_us_per_record": 1e6 * spent["workers"] / (batches * BATCH),
        "loader_cores": loader / elapsed,
        "ray_system_cores": spent["ray_system"] / elapsed,
        "workers_cores": spent["workers"] / elapsed,
        "other_workers_cores": spent["other_workers"] / elapsed,
        "all_cores": (loader + sum(spent.values())) / elapsed,
    }


def _idle(seconds: float) -> dict[str, float]:
    """Cores busy while every loader sits idle, its read-ahead full."""
    before = _descendants()
    cpu = time.process_time()
    start = time.perf_counter()
    time.sleep(seconds)
    loader = time.process_time() - cpu
    elapsed = time.perf_counter() - start
    spent = _spent(before, _descendants(), set())
    return {
        "loader": round(loader / elapsed, 3),
        "ray_system": round(spent["ray_system"] / elapsed, 3),
        "workers": round(spent["other_workers"] / elapsed, 3),
    }


def _rounds(entries: list[_Entry], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each entry's window once a round, the order rotating; ``--pause`` after each for
    the entry to refill its read-ahead before the next one runs."""
    windows = {e.name: partial(_window, e, args.seconds) for e in entries}
    return in_rounds(windows, args.rounds, args.pause)


def _figures(
    per_round: list[dict[str, dict[str, float]]], name: str, idle: dict[str, float]
) -> dict[str, Any]:
    """The medians over rounds of ``name``'s figures."""
    runs = [r[name] for r in per_round]

    def median(key: str, digits: int) -> float:
        return round(statistics.median(x[key] for x in runs), digits)

    above_idle = [  # the loading process's CPU a batch, less what it spends idle
        1000 * (x["loader_cores"] - idle["loader"]) * BATCH / x["rate"] for x in runs
    ]
    return {
        "records_per_s": round(median("rate", 0)),
        "loader_cpu_ms_per_batch": median("loader_cpu_ms_per_batch", 2),
        "loader_cpu_ms_per_batch_above_idle": round(statistics.median(above_idle), 2),
        "ray_system_cpu_ms_per_batch": median("ray_system_cpu_ms_per_batch", 2),
        "worker_cpu_us_per_record": median("worker_cpu_us_per_record", 1),
        "cores": {
            k: median(f"{k}_cores", 2)
            for k in ("loader", "ray_system", "workers", "other_workers", "all")
        },
    }


def _ratios(
    per_round: list[dict[str, dict[str, float]]], name: str, base: str
) -> tuple[float, list[float]]:
    ratio = [r[name]["rate"] / r[base]["rate"] for r in per_round]
    return round(statistics.median(ratio), 3), [round(x, 3) for x in ratio]


def _decode_part(args: argparse.Namespace, common: dict[str, Any]) -> None:
    """C: 2 Ray workers against 2 worker processes, on the PNG decode."""
    encoded, labels = encode_all(args.examples)
    source = {"png": encoded, "label": labels}
    entries: list[_Entry] = []
    try:
        for kind in ("processes", "ray"):
            entries.append(_Entry(f"{kind}:2", _loader(source, decode_crop, 2, kind), 2))
        time.sleep(args.pause)
        idle = _idle(max(args.seconds, 1.0))
        per_round = _rounds(entries, args)
        depth = {e.name: e.loader.prefetch_depth for e in entries}
    finally:
        for entry in entries:
            entry.close()
    for entry in entries:
        line: dict[str, Any] = {
            **common,
            "workload": "C",
            "name": entry.name,
            "worker_type": entry.name.split(":")[0],
            "num_workers": 2,
            "examples": args.examples,
            "prefetch_depth": depth[entry.name],
            "start_s": entry.start_s,
            "worker_pids_found": len(entry.pids),
            **_figures(per_round, entry.name, idle),
            "idle_cores": idle,
        }
        if entry.name == "ray:2":
            ratio, by_round = _ratios(per_round, "ray:2", "processes:2")
            line["ratio_to_processes"] = ratio
            line["ratio_by_round"] = by_round
            line["goal"] = GOAL_RATIO
        _emit(line)


def _scaling_part(args: argparse.Namespace, common: dict[str, Any], counts: list[int]) -> None:
    """S: 1, 2, 4, ... Ray workers on the sleeping transform."""
    source = images(args.examples)
    options = meshfeed.types.RayOptions(cpus=SCALING_CPUS)
    entries: list[_Entry] = []
    try:
        for w in counts:
            make = _loader(source, sleep_crop, w, options, prefetch=SCALING_PREFETCH)
            entries.append(_Entry(f"ray:{w}", make, w))
        time.sleep(IDLE_AFTER_S)  # ray:1 fills its 4 steps at 0.5 s each
        idle = _idle(max(args.seconds, 1.0))
        per_round = _rounds(entries, args)
    finally:
        for entry in entries:
            entry.close()
    base = entries[0].name
    saturated = None
    for w, entry in zip(counts, entries, strict=True):
        speedup, by_round = _ratios(per_round, entry.name, base)
        line: dict[str, Any] = {
            **common,
            "workload": "S",
            "name": entry.name,
            "worker_type": "ray",
            "num_workers": w,
            "ray_cpus_per_worker": SCALING_CPUS,
            "sleep_ms_per_record": SLEEP_S * 1000,
            "prefetch": SCALING_PREFETCH,
            "ideal_records_per_s": round(w / SLEEP_S),
            "start_s": entry.start_s,
            "worker_pids_found": len(entry.pids),
            **_figures(per_round, entry.name, idle),
            "idle_cores": idle,
            "speedup": speedup,
            "speedup_by_round": by_round,
            "efficiency": round(speedup * counts[0] / w, 3),
            "goal_efficiency": GOAL_EFFICIENCY,
        }
        if saturated is None and line["efficiency"] < GOAL_EFFICIENCY:
            saturated = w
        _emit(line)
    summary = {"worker_counts": counts, "first_below_goal": saturated}  # None: none was
    _emit({**common, "workload": "S", "name": "saturation", **summary})


def _add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--examples", type=int, default=8192, help="images in each source")
    parser.add_argument("--workers", default="1,2,4,8,16,32", help="S's worker counts")
    parser.add_argument("--pause", type=float, default=0.5, help="seconds between windows")


def main() -> None:
    use_cpu_devices()
    smoke = {"seconds": 0.3, "rounds": 1, "examples": 1024, "pause": 0.1, "workers": "1,2"}
    args = arguments(__doc__, seconds=2.0, rounds=7, smoke=smoke, add=_add_flags)
    counts = [int(w) for w in args.workers.split(",")]
    # The raylet's warnings reach the driver's sys.stdout whatever log_to_driver says
    # ("(raylet) WARNING: 22 PYTHON worker processes have been started..."): keep them
    # out of the JSON lines.
    with contextlib.redirect_stdout(sys.stderr):
        ray = _start_ray()
        common = {
            "global_batch_size": BATCH,
            "rounds": args.rounds,
            "window_s": args.seconds,
            "smoke": args.smoke,
            "ray": ray.__version__,
        }
        try:
            _decode_part(args, common)
            time.sleep(args.pause)
            _scaling_part(args, common, counts)
        finally:
            ray.shutdown()


if __name__ == "__main__":
    main()
