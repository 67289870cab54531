"""The idioms users bring from other loaders: the epoch loop, ``with``, ``source[i]``."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import filter_fns
import jax
import numpy as np
import psutil
import pytest

import meshfeed
import record_fns
from formats_fns import source as format_source
from formats_fns import write_jsonl, write_tfrecord, write_wds
from source_fns import build_source, write

N = 100


def _loader(devices: int = 8, global_batch_size: Any = 16, **kwargs) -> meshfeed.Loader:
    mesh = meshfeed.make_mesh(data=devices, devices=jax.devices()[:devices])
    source = meshfeed.ArraySource({"id": np.arange(N)})
    return meshfeed.Loader(
        source,
        global_batch_size=global_batch_size,
        sharding=meshfeed.batch_sharding(mesh),
        **kwargs,
    )


def _ids(batches) -> list[int]:
    return [i for b in batches for i in np.asarray(b["id"]).tolist()]


def test_the_epoch_loop_gives_every_epoch_in_its_own_order():
    """``for epoch in range(3): for batch in loader:`` as PyTorch, tf.data and Keras
    write it: three epochs of 6 steps (num_epochs=1, the default), each example once an
    epoch (the 4 past the last whole batch dropped), each epoch in another order."""
    loader = _loader()
    epochs = [_ids(loader) for _ in range(3)]
    assert [len(e) for e in epochs] == [96, 96, 96] and len(loader) == 6
    for ids in epochs:
        assert len(set(ids)) == 96 and set(ids) <= set(range(N))
    assert epochs[0] != epochs[1] != epochs[2] != epochs[0]
    assert loader.step == 18
    loader.reset()  # back to the first epoch, and one epoch a loop again
    assert _ids(loader) == epochs[0]


def test_a_state_in_a_later_epoch_restores_there_on_another_device_count():
    loader = _loader()
    whole = [_ids(loader) for _ in range(3)]
    loader.reset()
    _ids(loader)  # epoch 1
    it = iter(loader)
    first = _ids(next(it) for _ in range(2))  # two steps into epoch 2
    state = loader.state()
    other = _loader(devices=4)
    other.restore(state)
    rest = _ids(other)
    assert first + rest == whole[1]
    assert _ids(other) == whole[2]  # and the epoch after it, as the first loader's


def test_a_loader_with_nothing_more_to_give_says_so():
    """Under a batch size that ramps, epochs do not line up with steps: a loop begun
    where its epochs ended raises, rather than yielding nothing."""
    loader = _loader(global_batch_size=[(0, 8), (4, 16)])
    assert len(_ids(loader)) > 0
    with pytest.raises(RuntimeError, match=r"ended at step .* pass num_epochs"):
        iter(loader)


def _meshfeed_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("meshfeed")]


def _children() -> set[int]:
    """This process's live children (in a test session also its servers and workers
    other tests left resting) but multiprocessing's resource tracker (one a process,
    started with the first shared memory, for good)."""
    return {
        p.pid
        for p in psutil.Process().children()
        if p.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(p.cmdline())
    }


def test_with_leaves_no_thread_or_worker_behind():
    """A loop left mid-way inside ``with`` (its iterator still referenced): the block's
    end stops the read-ahead's threads and the record workers; the loader then refuses
    a new loop, by name."""
    before, children = set(_meshfeed_threads()), _children()
    with _loader(record_transform=record_fns.copy_rows, num_workers=2, prefetch=4) as loader:
        it = iter(loader)
        next(it)
        assert _children() - children
        assert set(_meshfeed_threads()) - before
    assert not _children() - children
    assert not set(_meshfeed_threads()) - before
    assert list(it) == []  # the loop left open ends at its next step
    with pytest.raises(RuntimeError, match="the loader is closed"):
        iter(loader)


def _sources(tmp: Path) -> dict[str, Any]:
    sources: dict[str, Any] = {}
    for kind, name in (("store", "data"), ("parquet", "data.parquet"), ("hf", "hf"),
                       ("arrayrecord", "data.array_record")):  # fmt: skip
        write(kind, str(tmp / name))
        sources[kind] = build_source(kind, str(tmp / name))
    for kind in ("grain", "torch", "mix"):
        sources[kind] = build_source(kind, "")
    sources["array"] = meshfeed.ArraySource({"id": np.arange(10), "x": np.ones((10, 3))})
    for kind, paths in (("tar", write_wds(tmp / "tar")),
                        ("jsonl", write_jsonl(tmp / "jsonl", "plain")),
                        ("tfrecord", write_tfrecord(tmp / "tfrecord"))):  # fmt: skip
        meshfeed.index(paths)
        sources[kind] = format_source(kind, paths)
    docs = [np.arange(k % 7 + 1, dtype=np.int32) for k in range(50)]
    tokens = meshfeed.ArraySource({"tokens": meshfeed.Ragged.from_list(docs)})
    sources["ragged"] = tokens
    sources["pack"] = meshfeed.pack(tokens, seq_len=16)
    sources["selection"] = meshfeed.select(
        filter_fns.source(40), filter_fns.high, workers=0, cache_dir=tmp / "c", progress=False
    )
    return sources


def test_every_built_in_source_takes_an_int_index(tmp_path):
    """``source[i]`` gives one example: each field's row of ``source[np.array([i])]`` (a
    document's array for a ragged field); ``source[-1]`` is the last; out of range is
    an ``IndexError`` naming the range."""
    for kind, source in _sources(tmp_path).items():
        n = len(source)
        for i in (0, n - 1, -1):
            one = source[i]
            rows = source[np.array([i % n])]
            assert sorted(one) == sorted(rows), kind
            for name, value in one.items():
                expected = rows[name][0]
                np.testing.assert_array_equal(np.asarray(value), np.asarray(expected), kind)
        with pytest.raises(IndexError, match=f"out of range for a source of {n} examples"):
            source[n]


def test_a_bool_is_not_an_index():
    with pytest.raises(TypeError, match="pass an int index or an array of ids"):
        meshfeed.ArraySource({"id": np.arange(4)})[True]


def test_fit_past_a_pass_runs_into_the_next_epochs():
    """``fit(num_steps=10)`` on a loader of 6 steps an epoch trains 10 steps: the loop
    runs on into the next epoch, as an epoch loop would; without ``num_steps``, one pass."""
    import optax

    loader = _loader()
    mesh = meshfeed.make_mesh(data=8)  # the loader's

    def loss(params, batch):
        return meshfeed.masked_mean((batch["id"] * params["w"]) ** 2, batch), {}

    optimizer = optax.sgd(0.0)
    state = meshfeed.TrainState.create({"w": np.float32(1.0)}, optimizer, mesh=mesh)
    step = meshfeed.make_train_step(loss, optimizer, mesh=mesh)
    history = meshfeed.fit(step, state, loader, num_steps=10, progress=False)
    assert history.steps == 10 and loader.step == 10
    history = meshfeed.fit(step, history.state, loader, progress=False)
    assert history.steps == 2 and loader.step == 12  # the rest of the second epoch
