"""Loader throughput: samples/s into global jax.Arrays on 8 CPU devices, one process.

Workloads A (60000 x 28x28x1 uint8 images + labels, batch 256) and B (20000 x 2048
int32 tokens, batch 64), shuffled: every meshfeed strategy against the floor (a numpy
gather of precomputed ids + ``make_array_from_process_local_data``) and the peers, Grain
``MapDataset`` and the PyTorch ``DataLoader``, each ending in the same global array.
``--processes 2`` runs it on 2 processes x 4 devices. README.md says more. Prints
samples_per_s, ratio_to_floor and ratio_to_best_peer; ``--smoke`` for CI.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import arguments, make_line, use_cpu_devices

import meshfeed
from common import Records, Run, collate, measure, not_installed, to_global, torch_batches


def workloads(smoke: bool) -> dict[str, tuple[dict[str, np.ndarray], int]]:
    rng = np.random.default_rng(0)
    a_n = 2048 if smoke else 60_000
    b_n = 512 if smoke else 20_000
    image = rng.integers(0, 256, (a_n, 28, 28, 1), dtype=np.uint8)
    label = rng.integers(0, 10, a_n, dtype=np.int32)
    tokens = rng.integers(0, 50_000, (b_n, 2048), dtype=np.int32)
    return {"A": ({"image": image, "label": label}, 256), "B": ({"tokens": tokens}, 64)}


def _meshfeed(
    arrays: dict[str, np.ndarray], batch: int, strategy: str, check_every: int | None = None
) -> Run:
    # data=4, model=2: model replicas give check_replicas something to compare.
    mesh = (
        meshfeed.make_mesh(data=8) if check_every is None else meshfeed.make_mesh(data=4, model=2)
    )
    sharding = meshfeed.batch_sharding(mesh)

    def run() -> Any:
        loader = meshfeed.Loader(
            meshfeed.ArraySource(arrays),
            global_batch_size=batch,
            sharding=sharding,
            strategy=strategy,  # type: ignore[arg-type]
            num_epochs=None,
            check_every=check_every,
        )
        if strategy != "reshard":
            yield from loader
            return
        move = jax.jit(lambda b: meshfeed.reshard(b, sharding))
        for b in loader:
            yield move(b)

    return run


def _floor(arrays: dict[str, np.ndarray], batch: int) -> Run:
    sharding = meshfeed.batch_sharding(meshfeed.make_mesh(data=jax.device_count()))
    n = len(next(iter(arrays.values())))
    steps = n // batch
    order = np.random.default_rng(0).permutation(n)
    per = batch // jax.process_count()  # this process's rows under P('data')
    share = slice(jax.process_index() * per, (jax.process_index() + 1) * per)
    ids = [order[i * batch : (i + 1) * batch][share] for i in range(steps)]

    def run() -> Any:
        k = 0
        while True:
            rows = ids[k % steps]
            yield {
                name: jax.make_array_from_process_local_data(
                    sharding, a[rows], (batch, *a.shape[1:])
                )
                for name, a in arrays.items()
            }
            k += 1

    return run


def _grain(arrays: dict[str, np.ndarray], batch: int) -> Run | str:
    try:
        import grain
    except ImportError:
        return not_installed("grain")

    def run() -> Any:
        epoch = 0
        while True:
            ds = (
                grain.MapDataset.source(Records(arrays))
                .shuffle(seed=epoch)
                .batch(batch // jax.process_count(), drop_remainder=True, batch_fn=collate)
            )
            yield from to_global(iter(ds), batch)
            epoch += 1

    return run


def _entries(arrays: dict[str, np.ndarray], batch: int) -> dict[str, tuple[str, Run | str]]:
    entries: dict[str, tuple[str, Run | str]] = {"floor": ("floor", _floor(arrays, batch))}
    for strategy in meshfeed.inspect.STRATEGIES:
        entries[f"meshfeed:{strategy}"] = ("meshfeed", _meshfeed(arrays, batch, strategy))
    # The cost of replica checks: the same layout without and with check_every=1.
    no_check = _meshfeed(arrays, batch, "per_process", check_every=10**9)
    entries["meshfeed:per_process:data4xmodel2"] = ("meshfeed", no_check)
    check = _meshfeed(arrays, batch, "per_process", check_every=1)
    entries["meshfeed:per_process:data4xmodel2+check_every=1"] = ("meshfeed", check)
    entries["grain"] = ("peer", _grain(arrays, batch))
    entries["torch_dataloader"] = ("peer", torch_batches(Records(arrays), batch))
    return entries


def run(smoke: bool, seconds: float, rounds: int) -> list[dict[str, Any]]:
    """Every entry of both workloads, on this process; one dict per measurement.

    Interleaved rounds (each entry once a round, in the same order) so that drift hits
    every entry alike; on several processes each measures the same entry at once."""
    out = []
    for workload, (arrays, batch) in workloads(smoke).items():
        entries = _entries(arrays, batch)
        samples: dict[str, list[float]] = {name: [] for name in entries}
        for _ in range(rounds):
            for name, (_, entry) in entries.items():
                if isinstance(entry, str):
                    continue
                fixed = None
                if jax.process_count() > 1:  # every process measures the same entry
                    multihost_utils.sync_global_devices(f"{workload}:{name}")
                    if "check_every" in name:  # a collective per step: equal step counts
                        fixed = 5 if smoke else 40
                samples[name].append(measure(entry, batch, seconds, steps=fixed))
        rates = {name: statistics.median(v) for name, v in samples.items() if v}
        peers = [rates[n] for n, (kind, _) in entries.items() if kind == "peer" and n in rates]
        for name, (kind, entry) in entries.items():
            line = make_line(
                "loader_throughput",
                smoke=smoke,
                workload=workload,
                name=name,
                kind=kind,
                global_batch_size=batch,
                examples=len(next(iter(arrays.values()))),
                meshfeed=meshfeed.__version__,
            )
            if isinstance(entry, str):
                line["skipped"] = entry
            else:
                line["samples_per_s"] = round(rates[name])
                line["ratio_to_floor"] = round(rates[name] / rates["floor"], 3)
                if peers:
                    line["ratio_to_best_peer"] = round(rates[name] / max(peers), 3)
            out.append(line)
    return out


def _add_flags(parser: Any) -> None:
    parser.add_argument(
        "--processes", type=int, default=1, help="run as N processes x 8/N devices (127.0.0.1)"
    )


def main() -> None:
    use_cpu_devices()  # the processes of --processes keep their own device count
    args = arguments(
        __doc__, seconds=1.5, rounds=3, smoke={"seconds": 0.1, "rounds": 1}, add=_add_flags
    )
    if args.processes == 1:
        lines = run(args.smoke, args.seconds, args.rounds)
    else:
        import importlib

        from meshfeed.testing import run_in_processes

        here = importlib.import_module("loader_throughput")  # importable in each process
        lines = run_in_processes(
            here.run,
            args.smoke,
            args.seconds,
            args.rounds,
            num_processes=args.processes,
            devices_per_process=8 // args.processes,
            timeout_s=3600,
        )[0]
    for line in lines:
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
