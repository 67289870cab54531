"""Loader throughput, workloads A and B of README.md: samples/s into global jax.Arrays on
8 CPU devices (``--processes 2``: 2 processes x 4), meshfeed against a floor and peers.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import numpy as np
from harness import arguments, in_rounds, make_line, median_of, median_ratio, use_cpu_devices
from jax.experimental import multihost_utils

import meshfeed
from common import Records, Run, collate, grain_batches, measure, to_global, torch_batches

Entries = dict[str, tuple[str, Run | str]]  # name: (kind, its run or why it is skipped)
Rate = Callable[[str, Run], float]


def entry_lines(
    benchmark: str, workload: str, entries: Entries, rate: Rate, args: Any, **fields: Any
) -> list[dict[str, Any]]:
    """``rate(name, run)`` of every entry in rotating rounds; a line per entry: samples/s,
    and the medians of its per-round ratios to the floor and to the round's best peer."""
    timed = {n: r if isinstance(r, str) else partial(rate, n, r) for n, (_, r) in entries.items()}
    per_round = in_rounds(timed, args.rounds, pause=0)
    for figures in per_round:
        peers = [figures[n] for n, (kind, _) in entries.items() if kind == "peer" and n in figures]
        if peers:
            figures["best peer"] = max(peers)
    lines = []
    for name, (kind, run) in entries.items():
        head = {"workload": workload, "name": name, "kind": kind, **fields}
        line = make_line(benchmark, smoke=args.smoke, **head)
        if isinstance(run, str):
            line["skipped"] = run
        else:
            line["samples_per_s"] = round(median_of(per_round, name) or 0)
            for key, other in (("ratio_to_floor", "floor"), ("ratio_to_best_peer", "best peer")):
                if (ratio := median_ratio(per_round, name, other)) is not None:
                    line[key] = ratio
        lines.append(line)
    return lines


def _meshfeed(arrays: dict[str, np.ndarray], batch: int, strategy: str, every: int = 0) -> Run:
    """The ``Loader`` with ``strategy``; with ``check_every=every`` on a data=4, model=2 mesh
    (model replicas give check_replicas something to compare)."""
    mesh = meshfeed.make_mesh(data=4, model=2) if every else meshfeed.make_mesh(data=8)
    sharding = meshfeed.batch_sharding(mesh)
    move = jax.jit(lambda b: meshfeed.reshard(b, sharding))

    def run() -> Any:
        loader = meshfeed.Loader(
            meshfeed.ArraySource(arrays),
            global_batch_size=batch,
            sharding=sharding,
            strategy=strategy,  # type: ignore[arg-type]
            num_epochs=None,
            check_every=every or None,
        )
        return map(move, loader) if strategy == "reshard" else iter(loader)

    return run


def _floor(arrays: dict[str, np.ndarray], batch: int) -> Run:
    """A numpy gather of precomputed shuffled ids + ``make_array_from_process_local_data``."""
    n = len(next(iter(arrays.values())))
    order = np.random.default_rng(0).permutation(n)
    per = batch // jax.process_count()  # this process's rows under P('data')
    share = slice(jax.process_index() * per, (jax.process_index() + 1) * per)
    ids = [order[i * batch : (i + 1) * batch][share] for i in range(n // batch)]

    def run() -> Any:
        rows = itertools.cycle(ids)
        return to_global(({k: a[r] for k, a in arrays.items()} for r in rows), batch)

    return run


def _entries(arrays: dict[str, np.ndarray], batch: int) -> Entries:
    entries: Entries = {"floor": ("floor", _floor(arrays, batch))}
    for strategy in meshfeed.inspect.STRATEGIES:
        entries[f"meshfeed:{strategy}"] = ("meshfeed", _meshfeed(arrays, batch, strategy))
    # The cost of replica checks: the same layout without and with check_every=1.
    for name, every in (("", 10**9), ("+check_every=1", 1)):
        run = _meshfeed(arrays, batch, "per_process", every)
        entries[f"meshfeed:per_process:data4xmodel2{name}"] = ("meshfeed", run)
    entries["grain"] = ("peer", grain_batches(lambda: Records(arrays), batch, batch_fn=collate))
    entries["torch_dataloader"] = ("peer", torch_batches(Records(arrays), batch))
    return entries


def _rate(args: Any, workload: str, batch: int, name: str, run: Run) -> float:
    steps = None
    if jax.process_count() > 1:  # every process measures the same entry at once
        multihost_utils.sync_global_devices(f"{workload}:{name}")
        if "check_every" in name:  # a collective per step: equal step counts
            steps = 5 if args.smoke else 40
    return measure(run, batch, args.seconds, steps=steps)


def run(args: Any) -> list[dict[str, Any]]:
    """Every entry of both workloads, on this process; a line per entry."""
    rng = np.random.default_rng(0)
    a_n, b_n = (2048, 512) if args.smoke else (60_000, 20_000)
    image = rng.integers(0, 256, (a_n, 28, 28, 1), dtype=np.uint8)
    label = rng.integers(0, 10, a_n, dtype=np.int32)
    tokens = rng.integers(0, 50_000, (b_n, 2048), dtype=np.int32)
    workloads = {"A": ({"image": image, "label": label}, 256), "B": ({"tokens": tokens}, 64)}
    lines = []
    for workload, (arrays, batch) in workloads.items():
        fields = {"global_batch_size": batch, "examples": len(next(iter(arrays.values())))}
        fields["meshfeed"] = meshfeed.__version__
        rate = partial(_rate, args, workload, batch)
        entries = _entries(arrays, batch)
        lines += entry_lines("loader_throughput", workload, entries, rate, args, **fields)
    return lines


def main() -> None:
    use_cpu_devices()  # the processes of --processes keep their own device count
    args = arguments(
        __doc__,
        seconds=1.5,
        rounds=3,
        smoke={"seconds": 0.1, "rounds": 1},
        add=lambda p: p.add_argument("--processes", type=int, default=1, help="N x 8/N devices"),
    )
    if args.processes == 1:
        lines = run(args)
    else:
        from meshfeed.testing import run_in_processes

        per = 8 // args.processes
        lines = run_in_processes(
            run, args, num_processes=args.processes, devices_per_process=per, timeout_s=3600
        )[0]
    for line in lines:
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
