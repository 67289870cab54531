"""Record worker processes read an in-memory source's rows out of a shared copy.

The loading process then sends each step's ids only, makes no input block, and the
batches are those of the loading thread, epoch after epoch, even where the transform
writes to its record; a memmap, or a source too large to copy, goes the old way.
"""

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import meshfeed
import record_fns
from meshfeed.workers import _shared_rows

SHM = Path("/dev/shm")


def _segments():
    return {p.name for p in SHM.glob("psm_*")} if SHM.exists() else set()


def _run(source, workers, fn=record_fns.writes_its_record, steps=21):
    """Three epochs of 7 steps (100 examples, batches of 16, the last padded); the
    batches as numpy, the record pool (None without workers) and the loader's stats."""
    mesh = meshfeed.make_mesh(data=8)
    loader = meshfeed.Loader(
        source, global_batch_size=16, sharding=meshfeed.batch_sharding(mesh), num_epochs=3,
        last_batch="pad", record_transform=fn, num_workers=workers, seed=3,
    )  # fmt: skip
    with loader:
        batches = [{k: np.asarray(v) for k, v in b.items()} for b in loader]
        records = loader._parts.reader.records
        pool: Any = None if records is None else records._pool
        return batches, pool, loader.stats()


@pytest.fixture(scope="module")
def reference():
    return _run(record_fns.source(), 0)


def test_workers_read_an_in_memory_source_themselves_and_give_the_loading_threads_batches(
    reference,
):
    before = _segments()
    source = record_fns.source()
    image = source[np.arange(100)]["image"].copy()
    got, pool, stats = _run(source, 2)
    want, _, want_stats = reference
    assert len(got) == len(want) == 21
    for g, w in zip(got, want, strict=True):
        for name in w:
            np.testing.assert_array_equal(g[name], w[name])
    assert pool.shared is not None  # the workers read the shared copy
    assert stats["source"]["records"] == want_stats["source"]["records"] == 300
    assert stats["source"]["bytes"] == want_stats["source"]["bytes"]
    np.testing.assert_array_equal(source[np.arange(100)]["image"], image)  # untouched
    assert _segments() <= before  # the shared copy is unlinked with the pool


def test_the_shared_copy_replaces_every_input_block():
    source = record_fns.source()
    mesh = meshfeed.make_mesh(data=8)
    loader = meshfeed.Loader(
        source, global_batch_size=16, sharding=meshfeed.batch_sharding(mesh), num_epochs=1,
        last_batch="drop", record_transform=record_fns.crop, num_workers=2,
    )  # fmt: skip
    with loader:
        for _ in loader:
            pool: Any = loader._parts.reader.records._pool  # type: ignore[union-attr]
            assert pool.shared is not None
            assert pool._inputs.blocks == []  # no step's rows copied for the workers


@pytest.mark.parametrize("why", ["memmap", "too large"])
def test_a_memmap_or_a_large_source_goes_through_input_blocks(
    why, reference, tmp_path, monkeypatch
):
    arrays = {k: np.asarray(v) for k, v in record_fns.source()[np.arange(100)].items()}
    if why == "memmap":
        np.save(tmp_path / "image.npy", arrays["image"])
        arrays["image"] = np.load(tmp_path / "image.npy", mmap_mode="r")
    else:
        monkeypatch.setattr(_shared_rows, "MOST_BYTES", 1000)
    source = meshfeed.ArraySource(arrays)
    mesh = meshfeed.make_mesh(data=8)
    loader = meshfeed.Loader(
        source, global_batch_size=16, sharding=meshfeed.batch_sharding(mesh), num_epochs=3,
        last_batch="pad", record_transform=record_fns.writes_its_record, num_workers=2, seed=3,
    )  # fmt: skip
    with loader:
        got = []
        for batch in loader:
            got.append({k: np.asarray(v) for k, v in batch.items()})
            pool: Any = loader._parts.reader.records._pool  # type: ignore[union-attr]
            assert pool.shared is None and pool._inputs.blocks
    for g, w in zip(got, reference[0], strict=True):
        for name in w:
            np.testing.assert_array_equal(g[name], w[name])
