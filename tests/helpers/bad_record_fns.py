"""Bad records for the tests of on_error="skip"; module level so workers can import them."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

import meshfeed
from meshfeed.testing import local_shards

N, BATCH = 400, 32


def bad(example: int) -> bool:
    """1% of the examples (4 of 400), spread out: the ones a record transform fails on."""
    return example % 100 == 37


def decode(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """A random crop and noise, raising on the bad examples as a broken JPEG would."""
    label = int(record["label"])
    if bad(label):
        raise ValueError(f"cannot decode example {label}: truncated data\nmore detail")
    i, j = rng.integers(0, 5, 2)
    image = record["image"][i : i + 8, j : j + 8].astype(np.float32)
    return {"image": image + rng.random((8, 8), dtype=np.float32), "label": record["label"]}


class DecodesInChunks:
    """``decode`` with a batch form (``BatchedRecordFn``), as a decoder of a chunk of
    records is: ``prepare`` makes each record's draws, ``batch`` cuts the chunk, and
    raises for the whole chunk on its first bad record, as a chunk's decoder would."""

    def __call__(self, record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        return self.batch([record], [self.prepare(record, rng)])[0]

    def prepare(self, record: dict[str, Any], rng: np.random.Generator) -> Any:
        if bad(int(record["label"])):
            return None  # decode draws nothing for these: it raises first
        i, j = rng.integers(0, 5, 2)
        return int(i), int(j), rng.random((8, 8), dtype=np.float32)

    def batch(self, records: list[dict[str, Any]], prepared: list[Any]) -> list[dict[str, Any]]:
        broken = [int(r["label"]) for r in records if bad(int(r["label"]))]
        if broken:
            raise ValueError(f"cannot decode example {broken[0]}: truncated data\nmore detail")
        out = []
        for record, (i, j, noise) in zip(records, prepared, strict=True):
            image = record["image"][i : i + 8, j : j + 8].astype(np.float32)
            out.append({"image": image + noise, "label": record["label"]})
        return out


def fails_often(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """Raises on every third example: a broken transform, not a few bad records."""
    if int(record["label"]) % 3 == 0:
        raise KeyError("no such field")
    return decode(record, rng)


def source(n: int = N) -> meshfeed.ArraySource:
    rng = np.random.default_rng(0)
    return meshfeed.ArraySource(
        {
            "image": rng.integers(0, 256, (n, 12, 12), dtype=np.uint8),
            "label": np.arange(n, dtype=np.int32),
        }
    )


class BadReads:
    """A source whose read raises on the examples ``bad`` names (a decoder inside the
    source, as a TFRecord CRC or a malformed JSON line is) -- and counts its reads."""

    def __init__(self, inner: meshfeed.ArraySource) -> None:
        self.inner, self.reads = inner, 0

    @property
    def fields(self) -> Mapping[str, meshfeed.sources.FieldSpec]:
        return self.inner.fields

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, ids: np.ndarray) -> dict[str, Any]:
        self.reads += 1
        broken = [int(i) for i in np.asarray(ids) if bad(int(i))]
        if broken:
            raise ValueError(f"record {broken[0]} does not match its checksum")
        return self.inner[ids]


def loader(fn: Any = decode, *, source_: Any = None, **kwargs: Any) -> meshfeed.Loader:
    mesh = meshfeed.make_mesh(data=jax.device_count())
    options: dict[str, Any] = {
        "global_batch_size": BATCH,
        "sharding": meshfeed.batch_sharding(mesh),
        "seed": 5,
        "on_error": "skip",
        **({"record_transform": fn} if fn is not None else {}),
        **kwargs,
    }
    return meshfeed.Loader(source() if source_ is None else source_, **options)


def digest(batches: list[dict[str, Any]]) -> str:
    """One hash of this process's shards of every batch."""
    h = hashlib.sha256()
    for batch in batches:
        for name in sorted(batch):
            for index, shard in local_shards(batch[name]):
                h.update(repr(index).encode() + shard.tobytes())
    return h.hexdigest()


def stream(**kwargs: Any) -> tuple[str, list[tuple[int, int, str]], int]:
    """This process's hash of one epoch, its skipped examples, and its state's count."""
    feed = loader(**kwargs)
    try:
        batches = list(feed)
        return digest(batches), [tuple(s) for s in feed.skipped], feed.state()["skipped"]  # type: ignore[misc]
    finally:
        feed.close()
