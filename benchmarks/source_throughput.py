"""File formats: samples/s from Parquet and ArrayRecord files into global jax.Arrays.

Workload A's data (60000 x 28x28x1 uint8 images + int64 labels), shuffled, global batch
256 on 8 CPU devices, written at set-up as P, one Parquet file (``ParquetSource`` +
``Loader`` vs the PyTorch ``DataLoader`` over the table read with pyarrow) and R, one
ArrayRecord file (``ArrayRecordSource`` vs Grain's ``ArrayRecordDataSource`` and the
``DataLoader`` over it). Prints ``ratio_to_best_peer``; ``--smoke`` for CI.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from format_fns import decode_record, write_arrayrecord, write_parquet
from harness import arguments, emit, use_cpu_devices

import meshfeed
from common import Run, loader_batches, measure, not_installed, to_global, torch_batches

BATCH = 256
Entries = dict[str, tuple[str, Run | str]]


class _Batched:
    """A map-style dataset with ``__getitems__``: the DataLoader fetches a batch at once."""

    def __init__(self, n: int, get: Callable[[list[int]], dict[str, np.ndarray]]) -> None:
        self.n = n
        self.get = get

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return {k: v[0] for k, v in self.get([i]).items()}

    def __getitems__(self, ids: list[int]) -> dict[str, np.ndarray]:
        return self.get(ids)


def _torch(dataset: _Batched) -> Run | str:
    # __getitems__ already returns the batch
    return torch_batches(dataset, BATCH, collate_fn=lambda b: b)


def parquet_entries(path: str) -> Entries:
    import pyarrow.parquet as pq

    def table_rows(ids: list[int]) -> dict[str, np.ndarray]:
        part = table.take(ids)
        image = part.column("image").combine_chunks().flatten().flatten()
        return {
            "image": image.to_numpy().reshape(len(ids), 28, 28),
            "label": part.column("label").to_numpy(),
        }

    table = pq.read_table(path)
    ours = loader_batches(lambda: meshfeed.sources.ParquetSource(path), BATCH)
    return {
        "meshfeed:parquet": ("meshfeed", ours),
        "torch:pyarrow": ("peer", _torch(_Batched(table.num_rows, table_rows))),
    }


def arrayrecord_entries(path: str) -> Entries:
    from array_record.python.array_record_data_source import ArrayRecordDataSource

    def grain_run() -> Any:
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
        grain_entry = not_installed("grain")
    ours = loader_batches(lambda: meshfeed.sources.ArrayRecordSource(path, decode_record), BATCH)
    return {
        "meshfeed:arrayrecord": ("meshfeed", ours),
        "grain:arrayrecord": ("peer", grain_entry),
        "torch:arrayrecord": ("peer", _torch(_Batched(len(reader), records))),
    }


def _workloads(folder: str, n: int) -> dict[str, Entries]:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, n).astype(np.int64)
    workloads = {}
    try:
        write_parquet(f"{folder}/a.parquet", images, labels)
        workloads["P"] = parquet_entries(f"{folder}/a.parquet")
    except ImportError:
        workloads["P"] = {"meshfeed:parquet": ("meshfeed", "pyarrow is not installed")}
    try:
        write_arrayrecord(f"{folder}/a.array_record", images, labels)
        workloads["R"] = arrayrecord_entries(f"{folder}/a.array_record")
    except ImportError:
        workloads["R"] = {"meshfeed:arrayrecord": ("meshfeed", "array-record not installed")}
    return workloads


def main() -> None:
    use_cpu_devices()
    args = arguments(__doc__, seconds=2.0, rounds=3, smoke={"seconds": 0.2, "rounds": 1})
    n = 2048 if args.smoke else 60_000
    with tempfile.TemporaryDirectory() as folder:
        for workload, entries in _workloads(folder, n).items():
            samples: dict[str, list[float]] = {k: [] for k in entries}
            for _ in range(args.rounds):  # interleaved rounds, the same order each
                for name, (_, run) in entries.items():
                    if not isinstance(run, str):
                        samples[name].append(measure(run, BATCH, args.seconds))
            rates = {k: statistics.median(v) for k, v in samples.items() if v}
            peers = [rates[k] for k, (kind, _) in entries.items() if kind == "peer" and k in rates]
            for name, (kind, run) in entries.items():
                line: dict[str, Any] = {
                    "workload": workload,
                    "name": name,
                    "kind": kind,
                    "global_batch_size": BATCH,
                    "examples": n,
                }
                if isinstance(run, str):
                    line["skipped"] = run
                else:
                    line["samples_per_s"] = round(rates[name])
                    if peers:
                        line["ratio_to_best_peer"] = round(rates[name] / max(peers), 3)
                emit("source_throughput", smoke=args.smoke, **line)


if __name__ == "__main__":
    main()
