"""Loader throughput: samples/s into global jax.Arrays on 8 CPU devices, one process.

Workloads (both shuffled):
  A: 60000 x 28x28x1 uint8 images + int32 labels, global batch 256 (MNIST-shaped);
  B: 20000 x 2048 int32 tokens, global batch 64 (language-model-shaped).

Measured in one run, rounds interleaved so drift hits every entry alike:
  - each meshfeed strategy (``reshard`` includes the move to the target layout);
  - the floor: a numpy fancy-index gather of the same ids +
    ``jax.make_array_from_process_local_data``, ids computed before timing;
  - the peers a user would pick instead, with the same batch and a shuffle, each
    followed by the same ``make_array_from_process_local_data`` so that every entry ends
    in the same global jax.Array: Grain (``MapDataset.source().shuffle().batch()``) and
    the PyTorch ``DataLoader`` (map-style dataset, numpy collate, default workers).
    A peer that is not installed is skipped, and the line says so.

Prints one JSON line per measurement (samples_per_s, ratio_to_floor,
ratio_to_best_peer). ``--smoke`` runs a tiny version for CI.
"""

from __future__ import annotations

import os

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    # Under --processes (run_in_processes) each process already has its device count.
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import json
import platform
import statistics
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

import meshfeed
from common import measure, to_global

Batches = Callable[[], Iterator[Any]]


def workloads(smoke: bool) -> dict[str, tuple[dict[str, np.ndarray], int]]:
    rng = np.random.default_rng(0)
    a_n, b_n = (2048, 512) if smoke else (60_000, 20_000)
    return {
        "A": (
            {
                "image": rng.integers(0, 256, (a_n, 28, 28, 1), dtype=np.uint8),
                "label": rng.integers(0, 10, a_n, dtype=np.int32),
            },
            256,
        ),
        "B": ({"tokens": rng.integers(0, 50_000, (b_n, 2048), dtype=np.int32)}, 64),
    }


def _meshfeed(
    arrays: dict[str, np.ndarray], batch: int, strategy: str, check_every: int | None = None
) -> Batches:
    # data=4, model=2: model replicas give check_replicas something to compare.
    mesh = (
        meshfeed.make_mesh(data=8) if check_every is None else meshfeed.make_mesh(data=4, model=2)
    )
    sharding = meshfeed.batch_sharding(mesh)

    def run() -> Iterator[Any]:
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


def _share(batch: int) -> slice:
    """The batch rows this process's devices hold under P('data') on every device."""
    per = batch // jax.process_count()
    return slice(jax.process_index() * per, (jax.process_index() + 1) * per)


def _floor(arrays: dict[str, np.ndarray], batch: int) -> Batches:
    sharding = meshfeed.batch_sharding(meshfeed.make_mesh(data=jax.device_count()))
    n = len(next(iter(arrays.values())))
    steps = n // batch
    order = np.random.default_rng(0).permutation(n)
    ids = [order[i * batch : (i + 1) * batch][_share(batch)] for i in range(steps)]

    def run() -> Iterator[Any]:
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


class _Records:
    """Per-record random access, the shape Grain and PyTorch datasets take; on several
    processes, each process's peer reads its own share of the examples."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        p, count = jax.process_index(), jax.process_count()
        self.arrays = {k: a[p::count] for k, a in arrays.items()}
        self.n = len(next(iter(self.arrays.values())))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return {k: a[i] for k, a in self.arrays.items()}


def _collate(records: Any) -> dict[str, np.ndarray]:
    return {k: np.stack([r[k] for r in records]) for k in records[0]}


def _grain(arrays: dict[str, np.ndarray], batch: int) -> Batches | str:
    try:
        import grain
    except ImportError:
        return "grain is not installed (pip install 'meshfeed[bench]')"

    def run() -> Iterator[Any]:
        epoch = 0
        while True:
            ds = (
                grain.MapDataset.source(_Records(arrays))
                .shuffle(seed=epoch)
                .batch(batch // jax.process_count(), drop_remainder=True, batch_fn=_collate)
            )
            yield from to_global(iter(ds), batch)
            epoch += 1

    return run


def _torch(arrays: dict[str, np.ndarray], batch: int) -> Batches | str:
    try:
        import torch
        from torch.utils.data import DataLoader
    except ImportError:
        return "torch is not installed (pip install 'meshfeed[bench]')"

    def run() -> Iterator[Any]:
        loader = DataLoader(
            _Records(arrays),  # type: ignore[arg-type]
            batch_size=batch // jax.process_count(),
            shuffle=True,
            drop_last=True,
            collate_fn=_collate,
            generator=torch.Generator().manual_seed(0),
        )
        while True:
            yield from to_global(iter(loader), batch)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny data and timings, for CI")
    parser.add_argument("--seconds", type=float, default=1.5, help="per entry per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median")
    parser.add_argument(
        "--processes", type=int, default=1, help="run as N processes x 8/N devices (127.0.0.1)"
    )
    args = parser.parse_args()
    seconds, rounds = (0.1, 1) if args.smoke else (args.seconds, args.rounds)
    if args.processes == 1:
        lines = run(args.smoke, seconds, rounds)
    else:
        import importlib

        from meshfeed.testing import run_in_processes

        here = importlib.import_module("loader_throughput")  # importable in each process
        lines = run_in_processes(
            here.run,
            args.smoke,
            seconds,
            rounds,
            num_processes=args.processes,
            devices_per_process=8 // args.processes,
            timeout_s=3600,
        )[0]
    for line in lines:
        print(json.dumps(line), flush=True)


def run(smoke: bool, seconds: float, rounds: int) -> list[dict[str, Any]]:
    """Every entry of both workloads, on this process; one dict per measurement."""
    out = []
    versions = {
        "jax": jax.__version__,
        "meshfeed": meshfeed.__version__,
        "python": platform.python_version(),
    }
    for workload, (arrays, batch) in workloads(smoke).items():
        entries: dict[str, tuple[str, Batches | str]] = {"floor": ("floor", _floor(arrays, batch))}
        for strategy in meshfeed.inspect.STRATEGIES:
            entries[f"meshfeed:{strategy}"] = ("meshfeed", _meshfeed(arrays, batch, strategy))
        # The cost of replica checks: the same layout without and with check_every=1.
        entries["meshfeed:per_process:data4xmodel2"] = (
            "meshfeed",
            _meshfeed(arrays, batch, "per_process", check_every=10**9),
        )
        entries["meshfeed:per_process:data4xmodel2+check_every=1"] = (
            "meshfeed",
            _meshfeed(arrays, batch, "per_process", check_every=1),
        )
        entries["grain"] = ("peer", _grain(arrays, batch))
        entries["torch_dataloader"] = ("peer", _torch(arrays, batch))
        samples: dict[str, list[float]] = {name: [] for name in entries}
        for _ in range(rounds):
            for name, (_, entry) in entries.items():
                if not isinstance(entry, str):
                    fixed = None
                    if jax.process_count() > 1:  # every process measures the same entry
                        multihost_utils.sync_global_devices(f"{workload}:{name}")
                        if "check_every" in name:  # a collective per step: equal step counts
                            fixed = 5 if smoke else 40
                    samples[name].append(measure(entry, batch, seconds, steps=fixed))
        rates = {name: statistics.median(v) for name, v in samples.items() if v}
        peers = [rates[n] for n, (kind, _) in entries.items() if kind == "peer" and n in rates]
        best_peer = max(peers) if peers else None
        for name, (kind, run) in entries.items():
            line: dict[str, Any] = {
                "benchmark": "loader_throughput",
                "workload": workload,
                "name": name,
                "kind": kind,
                "global_batch_size": batch,
                "examples": len(next(iter(arrays.values()))),
                "devices": jax.device_count(),
                "processes": jax.process_count(),
                "smoke": smoke,
                **versions,
            }
            if isinstance(run, str):
                line["skipped"] = run
            else:
                rate = rates[name]
                line["samples_per_s"] = round(rate)
                line["ratio_to_floor"] = round(rate / rates["floor"], 3)
                if best_peer:
                    line["ratio_to_best_peer"] = round(rate / best_peer, 3)
            out.append(line)
    return out


if __name__ == "__main__":
    main()
