"""shuffle_block: a keyed order that reads contiguous runs, exact on resume."""

import itertools

import numpy as np
import pytest

import meshfeed
from meshfeed.feed._schedule import BlockOrder
from meshfeed.schedules import Permutation


def _runs(ids: np.ndarray) -> int:
    ordered = np.unique(ids)
    return int(np.sum(np.diff(ordered) != 1)) + 1


def test_permutation_inverse_undoes_it():
    for n in (1, 2, 7, 1000, 4097):
        perm = Permutation(n, seed=3, epoch=1)
        np.testing.assert_array_equal(perm.inverse(perm(np.arange(n))), np.arange(n))


@pytest.mark.parametrize(
    ("n", "k", "w"), itertools.product([1, 7, 1000, 1003], [1, 3, 64, 5000], [1, 2, 16])
)
def test_block_order_is_a_bijection(n, k, w):
    for epoch in range(2):
        out = BlockOrder(n, k, w, seed=epoch + 1, epoch=epoch)(np.arange(n))
        np.testing.assert_array_equal(np.sort(out), np.arange(n))


def test_block_order_depends_on_seed_and_epoch_and_is_evaluated_position_by_position():
    n = 5000
    whole = BlockOrder(n, 100, 8, seed=1, epoch=0)(np.arange(n))
    assert not np.array_equal(whole, BlockOrder(n, 100, 8, seed=2, epoch=0)(np.arange(n)))
    assert not np.array_equal(whole, BlockOrder(n, 100, 8, seed=1, epoch=1)(np.arange(n)))
    positions = np.array([4999, 0, 2500, 17, 17])
    np.testing.assert_array_equal(
        BlockOrder(n, 100, 8, seed=1, epoch=0)(positions), whole[positions]
    )


@pytest.mark.parametrize("n", [10_000, 10_037])  # whole blocks, and a short last block
def test_each_step_reads_a_few_runs_and_each_block_once(n):
    k, w, b = 500, 8, 256
    schedule = meshfeed.schedules.Schedule(
        n, b, shuffle=True, seed=0, last_batch="pad", block=k, window=w
    )
    per_row = meshfeed.schedules.Schedule(n, b, shuffle=True, seed=0, last_batch="pad")
    seen = np.concatenate([schedule.ids(s) for s in range(schedule.steps_per_epoch)])
    np.testing.assert_array_equal(np.sort(seen[seen >= 0]), np.arange(n))
    runs, per_row_runs = 0, 0
    for step in range(schedule.steps_per_epoch):
        ids, row_ids = schedule.ids(step), per_row.ids(step)
        # a run per block of the window, one more where a block wraps around, and the
        # window boundary inside a step
        assert _runs(ids[ids >= 0]) <= 2 * w + 2, step
        runs += _runs(ids[ids >= 0])
        per_row_runs += _runs(row_ids[row_ids >= 0])
    assert per_row_runs > 10 * runs
    # Rows of one block are read in one window: the positions of a block's rows span at
    # most one window of positions (w * k), so a block is read once per epoch.
    position = np.empty(n, np.int64)
    position[seen[seen >= 0]] = np.flatnonzero(seen >= 0)
    for block in range(-(-n // k)):
        span = position[block * k : (block + 1) * k]
        assert span.max() - span.min() < w * k


def _loader(**overrides):
    mesh = meshfeed.make_mesh(data=8)
    kwargs = {"global_batch_size": 16, "sharding": meshfeed.batch_sharding(mesh)}
    kwargs.update(overrides)
    source = meshfeed.ArraySource({"x": np.arange(200, dtype=np.int32)})
    return meshfeed.Loader(source, num_epochs=2, **kwargs)


def test_a_loader_with_shuffle_block_sees_every_example_once_per_epoch_and_resumes_exactly():
    loader = _loader(shuffle_block=10, shuffle_window=4)
    batches = [np.asarray(batch["x"]) for batch in loader]
    assert len(batches) == 2 * 12
    for epoch in (batches[:12], batches[12:]):
        seen = np.concatenate(epoch)
        assert len(np.unique(seen)) == len(seen) == 192
    again = _loader(shuffle_block=10, shuffle_window=4)
    for _ in itertools.islice(again, 5):
        pass
    state = again.state()
    resumed = _loader(shuffle_block=10, shuffle_window=4)
    resumed.restore(state)
    rest = [np.asarray(batch["x"]) for batch in resumed]
    for got, want in zip(rest, batches[5:], strict=True):
        np.testing.assert_array_equal(got, want)
    assert not np.array_equal(batches[0], np.asarray(next(iter(_loader()))["x"]))


@pytest.mark.parametrize(
    ("saved", "loaded", "match"),
    [
        ({"shuffle_block": 10}, {}, "another shuffle_block: shuffle_block=10 in the state, None"),
        ({}, {"shuffle_block": 10}, "another shuffle_block: shuffle_block=None in the state, 10"),
        ({"shuffle_block": 10}, {"shuffle_block": 20}, "another shuffle_block"),
        (
            {"shuffle_block": 10},
            {"shuffle_block": 10, "shuffle_window": 2},
            "another shuffle_window",
        ),
    ],
)
def test_a_state_with_another_block_shuffle_is_refused(saved, loaded, match):
    state = _loader(**saved).state()
    with pytest.raises(ValueError, match=match):
        _loader(**loaded).restore(state)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"shuffle_block": 0}, r"shuffle_block=0 must be an int >= 1"),
        ({"shuffle_block": 2.5}, r"shuffle_block=2.5 must be an int >= 1"),
        ({"shuffle_block": 8, "shuffle_window": 0}, r"shuffle_window=0 must be an int >= 1"),
        ({"shuffle_window": 4}, r"no shuffle_block was given; pass shuffle_block=k too"),
        ({"shuffle_block": 8, "shuffle": False}, r"but shuffle=False"),
    ],
)
def test_bad_block_shuffle_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _loader(**kwargs)
