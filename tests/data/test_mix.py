"""mix: proportions, determinism, resuming, and what it refuses."""

from __future__ import annotations

import numpy as np
import pytest

import meshfeed
from meshfeed.testing import assert_resumes_identically


def _tagged(tag: int, n: int) -> meshfeed.ArraySource:
    return meshfeed.ArraySource(
        {"src": np.full(n, tag, np.int32), "id": np.arange(n, dtype=np.int32)}
    )


def test_weights_hold_within_one_percent_over_100k_examples():
    mixture = meshfeed.mix([_tagged(0, 1000), _tagged(1, 300)], [0.7, 0.3], length=100_000)
    src = mixture[np.arange(100_000)]["src"]
    assert abs((src == 0).mean() - 0.7) < 0.01
    # Any window of a block's size holds the proportions too: sources interleave.
    assert abs((src[:1000] == 1).mean() - 0.3) < 0.01


def test_in_order_repeats_small_sources_in_order_and_covers_every_example():
    mixture = meshfeed.mix([_tagged(0, 50), _tagged(1, 7)], [1, 1], shuffle=False)
    got = mixture[np.arange(len(mixture))]
    for tag, n in ((0, 50), (1, 7)):
        ids = got["id"][got["src"] == tag]
        assert set(ids.tolist()) == set(range(n))
        np.testing.assert_array_equal(ids, np.arange(len(ids)) % n)


def test_each_pass_over_a_small_source_is_a_new_order_with_every_example_once():
    mixture = meshfeed.mix([_tagged(0, 500), _tagged(1, 7)], [1, 1])
    got = mixture[np.arange(len(mixture))]
    small = got["id"][got["src"] == 1]
    passes = [small[i : i + 7].tolist() for i in range(0, len(small) - 6, 7)]
    assert len(passes) >= 70
    assert all(sorted(p) == list(range(7)) for p in passes)  # every example once a pass
    assert len({tuple(p) for p in passes}) > len(passes) // 2  # and the orders differ


def test_a_loader_over_a_mixture_resumes_exactly():
    def make():
        return meshfeed.Loader(
            meshfeed.mix([_tagged(0, 40), _tagged(1, 25)], [0.6, 0.4], length=200),
            global_batch_size=8,
            sharding=meshfeed.batch_sharding(meshfeed.make_mesh(data=8)),
            num_epochs=2,
            prefetch=0,
        )

    assert assert_resumes_identically(make, max_steps=12) == 12


def test_a_state_from_other_weights_is_refused():
    sharding = meshfeed.batch_sharding(meshfeed.make_mesh(data=8))
    a, b = _tagged(0, 40), _tagged(1, 25)
    first = meshfeed.Loader(
        meshfeed.mix([a, b], [0.5, 0.5], length=200), global_batch_size=8, sharding=sharding
    )
    other = meshfeed.Loader(
        meshfeed.mix([a, b], [0.9, 0.1], length=200), global_batch_size=8, sharding=sharding
    )
    with pytest.raises(ValueError, match=r"the state is from another dataset: source="):
        other.restore(first.state())


def test_bad_mixtures_are_refused():
    a = _tagged(0, 10)
    with pytest.raises(ValueError, match="2 sources but 1 weights"):
        meshfeed.mix([a, a], [1.0])
    with pytest.raises(ValueError, match=r"must be finite numbers > 0"):
        meshfeed.mix([a, a], [1.0, 0.0])
    other = meshfeed.ArraySource({"src": np.zeros(5, np.int64), "id": np.zeros(5, np.int32)})
    with pytest.raises(ValueError, match=r"sources\[1\] has fields"):
        meshfeed.mix([a, other], [1, 1])
    with pytest.raises(ValueError, match=r"no place in a block of 10000"):
        meshfeed.mix([a, a], [1.0, 1e-6])
    with pytest.raises(TypeError, match="non-empty list of sources"):
        meshfeed.mix(a, [1.0])  # type: ignore[arg-type]
