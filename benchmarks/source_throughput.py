"""File formats: samples/s from Parquet and ArrayRecord files into global jax.Arrays.

One process, 8 CPU devices, shuffled, global batch 256, workload A's data (60000 x
28x28x1 uint8 images + int64 labels) written at set-up as

- P: one Parquet file (image as a fixed-size list column, row groups of 1000 rows):
  ``meshfeed.sources.ParquetSource`` + ``Loader`` vs the PyTorch ``DataLoader`` over the table
  read with pyarrow (batched ``__getitems__``, numpy collate), the way a pyarrow user
  feeds PyTorch;
- R: one ArrayRecord file of raw records (784 image bytes + 8 label bytes):
  ``meshfeed.sources.ArrayRecordSource(decode=...)`` + ``Loader`` vs Grain
  (``MapDataset.source(ArrayRecordDataSource).shuffle().map(decode).batch()``) vs the
  PyTorch ``DataLoader`` over the same data source (batched ``__getitems__``).

Every entry ends in the same global ``jax.Array`` (peers through
``make_array_from_process_local_data``). Prints one JSON line per measurement with
``ratio_to_best_peer``; ``--smoke`` for CI.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import json
import platform
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from format_fns import decode_record, write_arrayrecord, write_parquet

import meshfeed
from common import measure, to_global

BATCH = 256
Run = Callable[[], Iterator[Any]]


def _sharding() -> Any:
    return meshfeed.batch_sharding(meshfeed.make_mesh(data=8))


def _loader(make_source: Callable[[], meshfeed.Source]) -> Run:
    def run() -> Iterator[Any]:
        yield from meshfeed.Loader(
            make_source(), global_batch_size=BATCH, sharding=_sharding(), num_epochs=None
        )

    return run


class _Batched:
    """A map-style dataset with ``__getitems__``: the DataLoader fetches a batch at once."""

    def __init__(self, n: int, get: Callable[[list[int]], dict[str, np.ndarray]]) -> None:
        self.n, self.get = n, get

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return {k: v[0] for k, v in self.get([i]).items()}

    def __getitems__(self, ids: list[int]) -> dict[str, np.ndarray]:
        return self.get(ids)


def _torch(dataset: _Batched) -> Run | str:
    try:
        import torch
        from torch.utils.data import DataLoader
    except ImportError:
        return "torch is not installed (pip install 'meshfeed[bench]')"

    def run() -> Iterator[Any]:
        loader = DataLoader(
            dataset,  # type: ignore[arg-type]
            batch_size=BATCH,
            shuffle=True,
            drop_last=True,
            collate_fn=lambda b: b,  # __getitems__ already returns the batch
            generator=torch.Generator().manual_seed(0),
        )
        while True:
            yield from to_global(iter(loader), BATCH)

    return run


def parquet_entries(path: str) -> dict[str, tuple[str, Run | str]]:
    import pyarrow.parquet as pq

    def table_rows(ids: list[int]) -> dict[str, np.ndarray]:
        part = table.take(ids)
        image = part.column("image").combine_chunks().flatten().flatten()
        return {
            "image": image.to_numpy().reshape(len(ids), 28, 28),
            "label": part.column("label").to_numpy(),
        }

    table = pq.read_table(path)
    return {
        "meshfeed:parquet": ("meshfeed", _loader(lambda: meshfeed.sources.ParquetSource(path))),
        "torch:pyarrow": ("peer", _torch(_Batched(table.num_rows, table_rows))),
    }


def arrayrecord_entries(path: str) -> dict[str, tuple[str, Run | str]]:
    from array_record.python.array_record_data_source import ArrayRecordDataSource

    def grain_run() -> Iterator[Any]:
        import grain

        epoch = 0
        while True:
            ds = (
                grain.MapDataset.source(ArrayRecordDataSource([path]))
                .shuffle(seed=epoch)
                .map(decode_record)
                .batch(BATCH, drop_remainder=True)
            )
            yield from to_global(iter(ds), BATCH)
            epoch += 1

    reader = ArrayRecordDataSource([path])

    def records(ids: list[int]) -> dict[str, np.ndarray]:
        decoded = [decode_record(r) for r in reader.__getitems__(ids)]
        return {k: np.stack([d[k] for d in decoded]) for k in decoded[0]}

    try:
        import grain  # noqa: F401

        grain_entry: Run | str = grain_run
    except ImportError:
        grain_entry = "grain is not installed (pip install 'meshfeed[bench]')"
    return {
        "meshfeed:arrayrecord": (
            "meshfeed",
            _loader(lambda: meshfeed.sources.ArrayRecordSource(path, decode_record)),
        ),
        "grain:arrayrecord": ("peer", grain_entry),
        "torch:arrayrecord": ("peer", _torch(_Batched(len(reader), records))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny data and timings, for CI")
    parser.add_argument("--seconds", type=float, default=2.0, help="per entry per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median")
    args = parser.parse_args()
    n, seconds, rounds = (2048, 0.2, 1) if args.smoke else (60_000, args.seconds, args.rounds)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, n).astype(np.int64)
    with tempfile.TemporaryDirectory() as tmp:
        workloads = {}
        try:
            write_parquet(f"{tmp}/a.parquet", images, labels)
            workloads["P"] = parquet_entries(f"{tmp}/a.parquet")
        except ImportError:
            workloads["P"] = {"meshfeed:parquet": ("meshfeed", "pyarrow is not installed")}
        try:
            write_arrayrecord(f"{tmp}/a.array_record", images, labels)
            workloads["R"] = arrayrecord_entries(f"{tmp}/a.array_record")
        except ImportError:
            workloads["R"] = {"meshfeed:arrayrecord": ("meshfeed", "array-record not installed")}
        for workload, entries in workloads.items():
            samples: dict[str, list[float]] = {k: [] for k in entries}
            for _ in range(rounds):
                for name, (_, run) in entries.items():
                    if not isinstance(run, str):
                        samples[name].append(measure(run, BATCH, seconds))
            rates = {k: statistics.median(v) for k, v in samples.items() if v}
            peers = [rates[k] for k, (kind, _) in entries.items() if kind == "peer" and k in rates]
            for name, (kind, run) in entries.items():
                line: dict[str, Any] = {
                    "benchmark": "source_throughput",
                    "workload": workload,
                    "name": name,
                    "kind": kind,
                    "global_batch_size": BATCH,
                    "examples": n,
                    "devices": jax.device_count(),
                    "processes": jax.process_count(),
                    "smoke": args.smoke,
                    "jax": jax.__version__,
                    "python": platform.python_version(),
                }
                if isinstance(run, str):
                    line["skipped"] = run
                else:
                    line["samples_per_s"] = round(rates[name])
                    if peers:
                        line["ratio_to_best_peer"] = round(rates[name] / max(peers), 3)
                print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
