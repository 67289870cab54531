"""Steps placed on threads of their own (``place_threads``): the same stream, in order.

Restoring while steps are placed ahead, and an error raised at its step, are
``test_pipeline``'s tests, run with placing threads too."""

from __future__ import annotations

import gc
import threading

import jax
import numpy as np
import pytest

import meshfeed
import record_fns

STRATEGIES = ["per_process", "global", "per_device", "reshard"]


def _loader(**kwargs):
    mesh = meshfeed.make_mesh(data=4, model=2)
    source = meshfeed.ArraySource(
        {"id": np.arange(200), "image": np.arange(200 * 12, dtype=np.uint8).reshape(200, 12)}
    )
    return meshfeed.Loader(
        source, global_batch_size=16, sharding=meshfeed.batch_sharding(mesh), seed=1, **kwargs
    )


def _values(batches):
    return [{k: np.asarray(v).tolist() for k, v in b.items()} for b in batches]


def _placers():
    return [t for t in threading.enumerate() if t.name == "meshfeed-place"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_placing_on_threads_gives_the_same_stream(strategy):
    want = _values(_loader(strategy=strategy, place_threads=0))
    assert _values(_loader(strategy=strategy, place_threads=3)) == want


@pytest.mark.parametrize("kind", ["processes", "threads"])
def test_placing_on_threads_collects_record_workers_rows_the_same(kind):
    options = {"record_transform": record_fns.copy_rows, "num_workers": 2, "worker_type": kind}
    plain, threaded = _loader(**options, place_threads=0), _loader(**options, place_threads=2)
    try:
        assert _values(threaded) == _values(plain)
    finally:
        plain.close()
        threaded.close()


def test_auto_places_on_the_loops_thread_on_cpu_devices():
    loader = _loader()
    it = iter(loader)
    next(it)
    assert loader.options.place_threads == "auto" and not _placers()
    del it


def test_breaking_out_stops_the_placing_threads():
    loader = _loader(place_threads=3)
    for step, _ in enumerate(loader):
        if step == 2:
            assert len(_placers()) == 3
            break
    gc.collect()
    assert loader.step == 3 and not _placers()
    jax.block_until_ready(next(iter(loader)))
    assert loader.step == 4


@pytest.mark.parametrize("value", [-1, 1.5, "many", True])
def test_place_threads_must_be_auto_or_a_count(value):
    with pytest.raises(ValueError, match=r"place_threads=.* must be 'auto'"):
        _loader(place_threads=value)
