import numpy as np
import pytest

from meshfeed.schedules import Permutation, Schedule


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 65, 1000, 60_001])
def test_permutation_is_a_bijection(n):
    out = Permutation(n, seed=5, epoch=0)(np.arange(n))
    np.testing.assert_array_equal(np.sort(out), np.arange(n))


def test_permutation_depends_on_seed_and_epoch_only():
    n = 500
    a = Permutation(n, seed=1, epoch=0)(np.arange(n))
    np.testing.assert_array_equal(a, Permutation(n, seed=1, epoch=0)(np.arange(n)))
    assert not np.array_equal(a, Permutation(n, seed=2, epoch=0)(np.arange(n)))
    assert not np.array_equal(a, Permutation(n, seed=1, epoch=1)(np.arange(n)))
    # Evaluated id by id: any subset of positions gives the same ids as the whole.
    positions = np.array([499, 3, 250, 3])
    np.testing.assert_array_equal(Permutation(n, seed=1, epoch=0)(positions), a[positions])


def test_permutation_of_ten_billion_needs_no_n_sized_array():
    n = 10**10
    perm = Permutation(n, seed=0, epoch=0)
    positions = np.array([0, 1, n // 2, n - 2, n - 1])
    out = perm(positions)
    assert out.dtype == np.int64
    assert ((out >= 0) & (out < n)).all()
    assert len(np.unique(out)) == len(out)
    block = perm(np.arange(n - 100_000, n))
    assert len(np.unique(block)) == 100_000 and block.max() < n


def test_schedule_without_shuffle_is_in_order():
    s = Schedule(10, 4, shuffle=False, seed=0, last_batch="pad")
    assert s.steps_per_epoch == 3
    np.testing.assert_array_equal(s.ids(0), [0, 1, 2, 3])
    np.testing.assert_array_equal(s.ids(2), [8, 9, -1, -1])
    np.testing.assert_array_equal(s.ids(3), [0, 1, 2, 3])  # epoch 1


def test_schedule_drop_skips_only_the_partial_batch():
    s = Schedule(10, 4, shuffle=True, seed=0, last_batch="drop")
    assert s.steps_per_epoch == 2
    ids = np.concatenate([s.ids(0), s.ids(1)])
    assert len(np.unique(ids)) == 8 and ids.min() >= 0


def test_schedule_reshuffles_every_epoch():
    s = Schedule(1000, 1000, shuffle=True, seed=0, last_batch="drop")
    first, second = s.ids(0).copy(), s.ids(1).copy()
    assert not np.array_equal(first, second)
    np.testing.assert_array_equal(np.sort(first), np.sort(second))
