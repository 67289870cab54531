import threading

import numpy as np
import pytest

import meshfeed
from meshfeed._pipeline import Prefetcher


def _loader(**kwargs):
    mesh = meshfeed.make_mesh(data=8)
    source = meshfeed.ArraySource({"id": np.arange(200)})
    return meshfeed.Loader(
        source, global_batch_size=16, sharding=meshfeed.batch_sharding(mesh), **kwargs
    )


def _ids(batches):
    return [np.asarray(b["id"]).tolist() for b in batches]


def test_prefetching_does_not_change_the_stream():
    assert _ids(_loader(prefetch=0)) == _ids(_loader(prefetch=4))


def test_state_counts_consumed_batches_not_prefetched_ones():
    loader = _loader(prefetch=4)
    it = iter(loader)
    first = [next(it), next(it)]
    assert loader.state()["step"] == 2
    rest = list(it)
    assert _ids(first + rest) == _ids(_loader(prefetch=0))


def test_breaking_out_drops_what_was_built_ahead_and_stops_the_thread():
    loader = _loader(prefetch=3)
    for step, _ in enumerate(loader):
        if step == 1:
            break
    assert loader.step == 2
    assert not [t for t in threading.enumerate() if t.name == "meshfeed-prefetch"]
    assert _ids(loader) == _ids(_loader(prefetch=0))[2:]


def test_restore_while_iterating_continues_from_the_restored_step():
    loader = _loader(prefetch=2)
    reference = _ids(_loader(prefetch=0))
    it = iter(loader)
    next(it)
    state = loader.state()
    next(it)
    next(it)
    loader.restore(state)
    assert _ids(it) == reference[1:]


def test_an_error_while_prefetching_reaches_the_consumer():
    def transform(batch):
        if batch["id"].max() > 150:
            raise RuntimeError("bad record")
        return batch

    loader = _loader(prefetch=2, shuffle=False, transform=transform)
    with pytest.raises(RuntimeError, match="bad record"):
        list(loader)
    assert loader.step == 9  # the 9 batches of ids < 150 were handed out


def test_prefetcher_rejects_a_bad_depth():
    with pytest.raises(ValueError, match="depth=0 must be >= 1"):
        Prefetcher(lambda step: step, start=0, end=3, depth=0)
    with pytest.raises(ValueError, match="prefetch=-1 must be an int >= 0"):
        _loader(prefetch=-1)
