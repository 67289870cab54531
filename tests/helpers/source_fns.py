"""Round trips that tests run in every process (``run_in_processes``) for each source kind.

``build_source(kind, where)`` opens the test data set through one kind of source;
``round_trip`` loads it with ``"per_process"`` on whatever processes are running and
compares every local shard to the original arrays, counting the ids the source was asked
for.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

import meshfeed
from layouts import CountingSource
from meshfeed.testing import local_shards

N = 96
BATCH = 16


def original(n: int = N) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "image": rng.integers(0, 256, size=(n, 4, 4), dtype=np.uint8),
        "tokens": rng.integers(0, 1000, size=(n, 6), dtype=np.int32),
        "label": np.arange(n, dtype=np.int64),
    }


def encode(image: np.ndarray, tokens: np.ndarray, label: np.ndarray) -> bytes:
    return image.tobytes() + tokens.tobytes() + label.tobytes()


def decode(raw: bytes) -> dict[str, np.ndarray]:
    return {
        "image": np.frombuffer(raw[:16], np.uint8).reshape(4, 4),
        "tokens": np.frombuffer(raw[16:40], np.int32),
        "label": np.frombuffer(raw[40:48], np.int64)[0],
    }


class TorchDataset:
    """A map-style PyTorch dataset of the test data (tensors per field)."""

    def __init__(self) -> None:
        self.data = original()

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict[str, Any]:
        import torch

        return {k: torch.from_numpy(np.array(v[i])) for k, v in self.data.items()}


def write(kind: str, where: str) -> None:
    """Writes (or prepares) the test data for ``kind`` at ``where``."""
    data = original()
    if kind == "store":
        meshfeed.write_source(where, data, shard_size=40)
    elif kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        image = pa.FixedSizeListArray.from_arrays(
            pa.FixedSizeListArray.from_arrays(pa.array(data["image"].reshape(-1)), 4), 4
        )
        tokens = pa.FixedSizeListArray.from_arrays(pa.array(data["tokens"].reshape(-1)), 6)
        table = pa.table({"image": image, "tokens": tokens, "label": data["label"]})
        pq.write_table(table, where, row_group_size=20)
    elif kind == "arrayrecord":
        from array_record.python.array_record_module import ArrayRecordWriter

        writer = ArrayRecordWriter(where, "group_size:1")
        for i in range(N):
            writer.write(encode(data["image"][i], data["tokens"][i], data["label"][i]))
        writer.close()
    elif kind == "hf":
        import datasets

        features = datasets.Features(
            {
                "image": datasets.Array2D((4, 4), "uint8"),
                "tokens": datasets.Sequence(datasets.Value("int32"), length=6),
                "label": datasets.Value("int64"),
            }
        )
        datasets.Dataset.from_dict(data, features=features).save_to_disk(where)


def build_source(kind: str, where: str) -> Any:
    if kind == "store":
        return meshfeed.open_source(where)
    if kind == "parquet":
        return meshfeed.sources.ParquetSource(where)
    if kind == "arrayrecord":
        return meshfeed.sources.ArrayRecordSource(where, decode)
    if kind == "hf":
        import datasets

        return meshfeed.sources.HFSource(datasets.load_from_disk(where))
    if kind == "grain":
        import grain

        data = original()
        return meshfeed.sources.GrainSource(
            grain.MapDataset.source([{k: v[i] for k, v in data.items()} for i in range(N)])
        )
    if kind == "torch":
        return meshfeed.sources.TorchSource(TorchDataset())
    if kind == "mix":
        return meshfeed.mix(halves(), [0.5, 0.5], length=N)
    raise ValueError(f"unknown kind {kind!r}")


def halves() -> list[meshfeed.ArraySource]:
    data = original()
    return [
        meshfeed.ArraySource({k: v[: N // 2] for k, v in data.items()}),
        meshfeed.ArraySource({k: v[N // 2 :] for k, v in data.items()}),
    ]


def expected(kind: str, source: Any) -> dict[str, np.ndarray]:
    """What each id of ``source`` should hold: the original data (mixtures: mapped)."""
    data = original()
    if kind != "mix":
        return data
    which, local = source.locate(np.arange(N))
    return {k: v[which * (N // 2) + local] for k, v in data.items()}


def round_trips(where: dict[str, str]) -> dict[str, dict[str, Any]]:
    """``round_trip`` for each kind at its place, in these processes one after another."""
    return {kind: round_trip(kind, place) for kind, place in where.items()}


def round_trip(kind: str, where: str) -> dict[str, Any]:
    """Loads one shuffled epoch; returns mismatches and the ids asked for vs needed."""
    built = build_source(kind, where)
    source = CountingSource(built)
    data = expected(kind, built)
    mesh = meshfeed.make_mesh(data=jax.device_count())
    loader = meshfeed.Loader(
        source,
        global_batch_size=BATCH,
        sharding=meshfeed.batch_sharding(mesh),
        strategy="per_process",
        seed=3,
    )
    mismatches = 0
    needed: list[int] = []
    for step, batch in enumerate(loader):
        ids = loader.ids(step)
        for name, array in batch.items():
            for index, shard in local_shards(array):
                rows = ids[index[0]]
                if name == "image":
                    needed.extend(rows.tolist())
                if not np.array_equal(shard, data[name][rows][(slice(None), *index[1:])]):
                    mismatches += 1
    asked = sorted(int(i) for r in source.requests for i in r)
    return {"mismatches": mismatches, "asked": asked, "needed": sorted(set(needed))}
