"""Source throughput, workloads P and R of README.md: samples/s from Parquet and ArrayRecord
files into global jax.Arrays on 8 CPU devices, meshfeed's sources against peers.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from collections.abc import Callable

import numpy as np
from harness import arguments, use_cpu_devices
from loader_throughput import Entries, entry_lines

import meshfeed
from common import (
    Run,
    collate,
    grain_batches,
    loader_batches,
    measure,
    not_installed,
    torch_batches,
)

BATCH = 256


def decode_record(raw: bytes) -> dict[str, np.ndarray]:
    """784 image bytes + an int64 label, as ``arrayrecord_entries`` writes them."""
    return {
        "image": np.frombuffer(raw, np.uint8, 784).reshape(28, 28),
        "label": np.frombuffer(raw, np.int64, 1, 784)[0],
    }


@dataclasses.dataclass
class _Batched:
    """A map-style dataset with ``__getitems__``: the DataLoader fetches a batch at once."""

    n: int
    get: Callable[[list[int]], dict[str, np.ndarray]]

    def __len__(self) -> int:
        return self.n

    def __getitems__(self, ids: list[int]) -> dict[str, np.ndarray]:
        return self.get(ids)


def _torch(n: int, get: Callable[[list[int]], dict[str, np.ndarray]]) -> Run | str:
    # __getitems__ already returns the batch
    return torch_batches(_Batched(n, get), BATCH, collate_fn=lambda b: b)


def parquet_entries(path: str, images: np.ndarray, labels: np.ndarray) -> Entries:
    import pyarrow as pa
    import pyarrow.parquet as pq

    flat = pa.array(images.reshape(-1))
    image = pa.FixedSizeListArray.from_arrays(pa.FixedSizeListArray.from_arrays(flat, 28), 28)
    pq.write_table(pa.table({"image": image, "label": labels}), path, row_group_size=1000)
    table = pq.read_table(path)

    def table_rows(ids: list[int]) -> dict[str, np.ndarray]:
        part = table.take(ids)
        image = part.column("image").combine_chunks().flatten().flatten()
        return {
            "image": image.to_numpy().reshape(len(ids), 28, 28),
            "label": part.column("label").to_numpy(),
        }

    ours = loader_batches(lambda: meshfeed.sources.ParquetSource(path), BATCH)
    return {
        "meshfeed:parquet": ("meshfeed", ours),
        "torch:pyarrow": ("peer", _torch(table.num_rows, table_rows)),
    }


def arrayrecord_entries(path: str, images: np.ndarray, labels: np.ndarray) -> Entries:
    from array_record.python.array_record_data_source import ArrayRecordDataSource
    from array_record.python.array_record_module import ArrayRecordWriter

    writer = ArrayRecordWriter(path, "group_size:1")
    for image, label in zip(images, labels, strict=True):
        writer.write(image.tobytes() + label.tobytes())
    writer.close()
    reader = ArrayRecordDataSource([path])

    def records(ids: list[int]) -> dict[str, np.ndarray]:
        return collate([decode_record(r) for r in reader.__getitems__(ids)])

    ours = loader_batches(lambda: meshfeed.sources.ArrayRecordSource(path, decode_record), BATCH)
    grain = grain_batches(lambda: ArrayRecordDataSource([path]), BATCH, decode=decode_record)
    return {
        "meshfeed:arrayrecord": ("meshfeed", ours),
        "grain:arrayrecord": ("peer", grain),
        "torch:arrayrecord": ("peer", _torch(len(reader), records)),
    }


def main() -> None:
    use_cpu_devices()
    args = arguments(__doc__, seconds=2.0, rounds=3, smoke={"seconds": 0.2, "rounds": 1})
    n = 2048 if args.smoke else 60_000
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, n).astype(np.int64)
    workloads = {"P": ("parquet", parquet_entries), "R": ("arrayrecord", arrayrecord_entries)}
    fields = {"global_batch_size": BATCH, "examples": n}

    def rate(name: str, run: Run) -> float:
        return measure(run, BATCH, args.seconds)

    with tempfile.TemporaryDirectory() as folder:
        for workload, (kind, make) in workloads.items():
            try:
                entries: Entries = make(f"{folder}/a.{kind}", images, labels)
            except ImportError as missing:  # the package that writes the file
                entries = {f"meshfeed:{kind}": ("meshfeed", not_installed(str(missing.name)))}
            for line in entry_lines("source_throughput", workload, entries, rate, args, **fields):
                print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
