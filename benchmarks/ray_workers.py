"""Record workers on Ray: against worker processes, the loading process's CPU, scaling."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import jax
import psutil
from decode_fns import decode_crop, encode_all
from gpu_host import array_loader
from harness import arguments, emit, in_rounds, median_of, median_ratio, use_cpu_devices
from worker_fns import SLEEP_S, sleep_crop
from workload_fns import images

import meshfeed

BATCH = 256
RAY_CPUS = 16  # logical CPUs of the local Ray: room for all of S's workers at once
SCALING_CPUS = 0.25  # what each of S's workers reserves
SCALING_PREFETCH = 8
IDLE_AFTER_S = 3.0  # before the idle CPU is measured: every read-ahead full by then
GOAL_RATIO = 0.8
GOAL_EFFICIENCY = 0.8
CORES = ("loader", "ray_system", "workers", "other_workers", "all")

# JAX warns on every os.fork() once it is initialised; Ray's start-up forks. Harmless.
warnings.filterwarnings("ignore", message=r".*os\.fork\(\).*", category=RuntimeWarning)

_OUT = sys.stdout  # the JSON lines; Ray's own messages go to stderr (``main``)


def _worker_pids() -> set[int]:
    return {pid for pid, (kind, _) in _descendants().items() if kind == "worker"}


class _Entry:
    """A loader (``name``: ``kind:workers``) built once, its endless iterator, and its
    record workers' pids."""

    def __init__(self, name: str, source: Any, fn: Any, worker_type: Any, **options: Any) -> None:
        before = _worker_pids()
        start = time.perf_counter()
        self.name, self.workers = name, int(name.split(":")[1])
        self.loader = array_loader(
            source,
            BATCH,
            record_transform=fn,
            num_workers=self.workers,
            worker_type=worker_type,
            seed=0,
            **options,
        )
        self.it: Iterator[Any] = iter(self.loader)
        for _ in range(3):
            self.next()
        deadline = time.monotonic() + 120
        while True:  # the workers still starting (the batches went to the first ones)
            self.pids = _worker_pids() - before
            if len(self.pids) >= self.workers or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.start_s = round(time.perf_counter() - start, 2)

    def next(self) -> None:
        jax.block_until_ready(next(self.it))


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


def _cores(before: dict[int, tuple[str, float]], own: set[int], cpu: float, start: float) -> Any:
    """Cores busy since ``before`` (a ``_descendants``), ``cpu`` (this process's CPU time)
    and ``start``: this process's, Ray's own, the ``own`` workers', the other record
    workers' (the other entries', idle), and all; and the seconds elapsed."""
    loader, elapsed = time.process_time() - cpu, time.perf_counter() - start
    out = dict.fromkeys(CORES, 0.0)
    for pid, (kind, seconds) in _descendants().items():
        group = "ray_system" if kind == "ray" else "workers" if pid in own else "other_workers"
        out[group] += seconds - before.get(pid, (kind, 0.0))[1]
    out["loader"] = loader
    out["all"] = sum(out.values())
    return {k: v / elapsed for k, v in out.items()}, elapsed


def _window(entry: _Entry, seconds: float, idle: float) -> dict[str, float]:
    """Records/s of ``entry`` over ``seconds`` (at least 2 batches), after taking the
    batches its read-ahead may hold and 2 more; the CPU spent meanwhile (the loading
    process's also less ``idle``, the cores it keeps busy when no batch is taken)."""
    for _ in range((entry.loader.prefetch_depth or 0) + 2):
        entry.next()
    before, cpu, start = _descendants(), time.process_time(), time.perf_counter()
    batches = 0
    while batches < 2 or time.perf_counter() - start < seconds:
        entry.next()
        batches += 1
    cores, elapsed = _cores(before, entry.pids, cpu, start)  # its scans: not the loader's
    per_batch = elapsed / batches
    return {
        "rate": BATCH / per_batch,
        "loader_cpu_ms_per_batch": 1000 * cores["loader"] * per_batch,
        "loader_cpu_ms_per_batch_above_idle": 1000 * (cores["loader"] - idle) * per_batch,
        "ray_system_cpu_ms_per_batch": 1000 * cores["ray_system"] * per_batch,
        "worker_cpu_us_per_record": 1e6 * cores["workers"] * per_batch / BATCH,
        **{f"{k}_cores": v for k, v in cores.items()},
    }


def _measured(
    workload: str, makes: list[Callable[[], _Entry]], settle_s: float, args: argparse.Namespace
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The entries ``makes`` builds, ``settle_s`` for their read-ahead to fill, the cores
    busy while all sit idle, then each one's window once a round, ``--pause`` after each;
    the rounds, and each entry's line of medians."""
    entries: list[_Entry] = []
    try:
        for make in makes:
            entries.append(make())
        time.sleep(settle_s)
        before, cpu, start = _descendants(), time.process_time(), time.perf_counter()
        time.sleep(max(args.seconds, 1.0))
        cores = _cores(before, set(), cpu, start)[0]  # every worker is an "other" one here
        keys = {"loader": "loader", "ray_system": "ray_system", "workers": "other_workers"}
        idle = {k: round(cores[key], 3) for k, key in keys.items()}
        windows = {e.name: partial(_window, e, args.seconds, idle["loader"]) for e in entries}
        per_round = in_rounds(windows, args.rounds, args.pause)
        lines = {
            e.name: {
                "workload": workload,
                "name": e.name,
                "worker_type": e.name.split(":")[0],
                "num_workers": e.workers,
                "prefetch_depth": e.loader.prefetch_depth,
                "start_s": e.start_s,
                "worker_pids_found": len(e.pids),
                **_figures(per_round, e.name),
                "idle_cores": idle,
            }
            for e in entries
        }
    finally:
        for entry in entries:
            entry.loader.close()
    return per_round, lines


def _figures(per_round: list[dict[str, Any]], name: str) -> Any:
    """The medians over rounds of ``name``'s figures."""

    def median(key: str, digits: int = 2) -> float:
        return round(median_of(per_round, name, key) or 0.0, digits)

    return {
        "records_per_s": round(median("rate", 0)),
        "loader_cpu_ms_per_batch": median("loader_cpu_ms_per_batch"),
        "loader_cpu_ms_per_batch_above_idle": median("loader_cpu_ms_per_batch_above_idle"),
        "ray_system_cpu_ms_per_batch": median("ray_system_cpu_ms_per_batch"),
        "worker_cpu_us_per_record": median("worker_cpu_us_per_record", 1),
        "cores": {k: median(f"{k}_cores") for k in CORES},
    }


def _by_round(per_round: list[dict[str, Any]], name: str, base: str) -> list[float]:
    return [round(r[name]["rate"] / r[base]["rate"], 3) for r in per_round]


def _decode_part(args: argparse.Namespace, common: dict[str, Any]) -> None:
    encoded, labels = encode_all(args.examples)
    source = {"png": encoded, "label": labels}
    makes = [partial(_Entry, f"{k}:2", source, decode_crop, k) for k in ("processes", "ray")]
    per_round, lines = _measured("C", makes, args.pause, args)
    for name, line in lines.items():
        line = {**common, **line, "examples": args.examples}
        if name == "ray:2":
            line["ratio_to_processes"] = median_ratio(per_round, name, "processes:2", "rate")
            line["ratio_by_round"] = _by_round(per_round, name, "processes:2")
            line["goal"] = GOAL_RATIO
        emit("ray_workers", stream=_OUT, **line)


def _scaling_part(args: argparse.Namespace, common: dict[str, Any], counts: list[int]) -> None:
    source, options = images(args.examples), meshfeed.types.RayOptions(cpus=SCALING_CPUS)
    prefetch = {"prefetch": SCALING_PREFETCH}
    makes = [partial(_Entry, f"ray:{w}", source, sleep_crop, options, **prefetch) for w in counts]
    per_round, lines = _measured("S", makes, IDLE_AFTER_S, args)  # ray:1 fills 4 steps at 0.5 s
    base = f"ray:{counts[0]}"
    saturated = None
    for w, (name, line) in zip(counts, lines.items(), strict=True):
        speedup = median_ratio(per_round, name, base, "rate") or 0.0
        del line["prefetch_depth"]  # S's lines give the fixed prefetch instead
        line = {**common, **line, "ray_cpus_per_worker": SCALING_CPUS}
        line |= {"sleep_ms_per_record": SLEEP_S * 1000, "prefetch": SCALING_PREFETCH}
        line |= {"ideal_records_per_s": round(w / SLEEP_S), "speedup": speedup}
        line["speedup_by_round"] = _by_round(per_round, name, base)
        line["efficiency"] = round(speedup * counts[0] / w, 3)
        line["goal_efficiency"] = GOAL_EFFICIENCY
        if saturated is None and line["efficiency"] < GOAL_EFFICIENCY:
            saturated = w
        emit("ray_workers", stream=_OUT, **line)
    summary = {"worker_counts": counts, "first_below_goal": saturated}  # None: none was
    emit("ray_workers", stream=_OUT, **common, workload="S", name="saturation", **summary)


def _add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--examples", type=int, default=8192, help="images in each source")
    parser.add_argument("--workers", default="1,2,4,8,16,32", help="S's worker counts")
    parser.add_argument("--pause", type=float, default=0.5, help="seconds between windows")


def main() -> None:
    import ray

    use_cpu_devices()
    smoke = {"seconds": 0.3, "rounds": 1, "examples": 1024, "pause": 0.1, "workers": "1,2"}
    args = arguments(__doc__, seconds=2.0, rounds=7, smoke=smoke, add=_add_flags)
    counts = [int(w) for w in args.workers.split(",")]
    # The raylet's warnings reach the driver's sys.stdout whatever log_to_driver says
    # ("(raylet) WARNING: 22 PYTHON worker processes have been started..."): keep them
    # out of the JSON lines.
    with contextlib.redirect_stdout(sys.stderr):
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
        common = {"global_batch_size": BATCH, "rounds": args.rounds, "window_s": args.seconds}
        common |= {"smoke": args.smoke, "ray": ray.__version__}
        try:
            _decode_part(args, common)
            time.sleep(args.pause)
            _scaling_part(args, common, counts)
        finally:
            ray.shutdown()


if __name__ == "__main__":
    main()
