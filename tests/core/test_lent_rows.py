"""Rows lent to the devices: memory a live array points at is never reused or overwritten.

The record workers' slots and the record stage's host buffers reach the devices without
a copy; on the CPU backend a placed ``jax.Array`` *is* that memory. These tests keep
batches (and a device shard taken out of one) while the loader reads many more steps
through the same few slots, and check the kept values. Each check is also run once with
lending broken on purpose (the memory given back at once), to show that it fails then.
"""

from __future__ import annotations

import gc
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshfeed
import meshfeed.core._held as held
import meshfeed.workers._shm as shm
import record_fns
from meshfeed.core._held import HostBuffers

SHM = Path("/dev/shm")
N, ROWS = 96, 16
SIDE = {"none": 64}  # without record workers only rows of 16 KiB or more are read into
# reused memory (64 x 64 int32); 8 x 8 elsewhere


def _source(side: int) -> meshfeed.ArraySource:
    ids = np.arange(N, dtype=np.int32)
    return meshfeed.ArraySource({"image": np.repeat(ids, side * side).reshape(N, side, side),
                                 "label": ids})  # fmt: skip


def _loader(workers: int, kind: str, **options) -> meshfeed.Loader:
    mesh = meshfeed.make_mesh(data=8)
    if kind != "none":
        options.update(record_transform=record_fns.copy_rows, num_workers=workers,
                       worker_type=kind)  # fmt: skip
    return meshfeed.Loader(
        _source(SIDE.get(kind, 8)),
        global_batch_size=ROWS,
        sharding=NamedSharding(mesh, P("data")),
        seed=3,
        num_epochs=None,
        **options,
    )


def _want(loader: meshfeed.Loader, step: int) -> np.ndarray:
    side = loader.source.fields["image"].shape[0]
    return np.repeat(loader.ids(step), side * side).reshape(ROWS, side, side)


def _kept_rows_change(workers: int, kind: str) -> bool:
    """Keeps step 0's batch and one device shard of step 1's, reads 24 more steps, and
    says whether any kept value changed meanwhile."""
    gc.freeze()  # what the session made before: out of the collections below (seconds)
    loader = _loader(workers, kind)
    try:
        it = iter(loader)
        first = next(it)
        shard = next(it)["image"].addressable_shards[3].data  # the rest of step 1 dropped
        for _ in range(24):
            jax.block_until_ready(next(it))
            gc.collect()  # what an idle moment would do: every dropped batch let go
        changed = not np.array_equal(np.asarray(first["image"]), _want(loader, 0))
        changed |= not np.array_equal(np.asarray(first["label"]), loader.ids(0))
        return changed or not np.array_equal(np.asarray(shard), _want(loader, 1)[6:8])
    finally:
        loader.close()
        gc.unfreeze()


def _broken_lend(buffer, fields, on_free):
    """``lend`` as a bug would have it: the memory handed back while still in use."""
    on_free()
    return {name: np.ndarray(shape, dtype, buffer=buffer, offset=at)
            for name, shape, dtype, at in fields}  # fmt: skip


CASES = [(1, "processes", shm), (2, "threads", held), (0, "processes", held), (0, "none", held)]


@pytest.mark.parametrize(("workers", "kind", "module"), CASES)
def test_kept_batches_keep_their_rows_while_later_steps_reuse_the_memory(workers, kind, module):
    assert not _kept_rows_change(workers, kind)


@pytest.mark.parametrize(("workers", "kind", "module"), CASES)
def test_the_check_fails_when_memory_is_given_back_while_in_use(workers, kind, module, monkeypatch):
    monkeypatch.setattr(module, "lend", _broken_lend)
    assert _kept_rows_change(workers, kind)


def test_a_batch_kept_past_close_stays_whole_and_its_memory_goes_with_it():
    before = {p.name for p in SHM.glob("psm_*")}
    loader = _loader(1, "processes")
    batch = next(iter(loader))
    loader.close()  # the slot's name is gone; its mapping stays while the batch lives
    assert {p.name for p in SHM.glob("psm_*")} <= before
    np.testing.assert_array_equal(np.asarray(batch["image"]), _want(loader, 0))
    del batch
    gc.collect()  # unmapped now, without a word on stderr (warnings are errors here)


def test_a_donated_batch_leaves_the_memory_it_came_from_alone():
    loader = _loader(1, "processes")
    try:
        it = iter(loader)
        kept = next(it)
        donated = next(it)
        add = jax.jit(lambda x: x + 1, donate_argnums=0)
        out = add(donated["image"])
        np.testing.assert_array_equal(np.asarray(out), _want(loader, 1) + 1)
        for _ in range(12):
            jax.block_until_ready(next(it))
        np.testing.assert_array_equal(np.asarray(kept["image"]), _want(loader, 0))
        np.testing.assert_array_equal(np.asarray(out), _want(loader, 1) + 1)
    finally:
        loader.close()


def test_slots_past_most_lent_are_copied_out_so_kept_batches_do_not_pin_new_memory():
    loader = _loader(1, "processes")
    try:
        it = iter(loader)
        kept = [next(it) for _ in range(3 * shm.MOST_LENT)]
        for step in range(len(kept)):
            np.testing.assert_array_equal(np.asarray(kept[step]["image"]), _want(loader, step))
        assert loader.stats()["record_transform"]["lent"] == shm.MOST_LENT  # then copies
        del kept
        gc.collect()
        jax.block_until_ready(next(it))  # takes back what came back
        assert loader.stats()["record_transform"]["lent"] <= 2
    finally:
        loader.close()


def test_host_buffers_are_reused_once_their_arrays_are_gone_and_capped_while_kept():
    spec = {"x": meshfeed.sources.FieldSpec((3,), np.dtype(np.float32))}
    buffers = HostBuffers(keep=2, most_lent=3)
    a = buffers.take(spec, 5)
    assert a["x"].shape == (5, 3) and a["x"].ctypes.data % 64 == 0
    address = a["x"].ctypes.data
    view = a["x"][1:]
    del a
    b = buffers.take(spec, 5)  # the view still holds the first buffer
    second = b["x"].ctypes.data
    assert second != address
    del view, b
    c = buffers.take(spec, 5)  # both are back: one of them again, no new one
    assert c["x"].ctypes.data in {address, second}
    kept = [buffers.take(spec, 5) for _ in range(4)]  # 3 lent, then plain arrays
    assert buffers.lent == 3 and all(k["x"].shape == (5, 3) for k in kept)
    del c, kept
    last = buffers.take(spec, 5)
    assert buffers.lent == 1 and last["x"].shape == (5, 3)
