import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import meshfeed
from meshfeed.feed._pipeline import Prefetcher


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


@pytest.mark.parametrize("place_threads", [0, 2])  # placed on the loop's thread, or ahead
def test_restore_while_iterating_continues_from_the_restored_step(place_threads):
    loader = _loader(prefetch=2, place_threads=place_threads)
    reference = _ids(_loader(prefetch=0))
    it = iter(loader)
    next(it)
    state = loader.state()
    next(it)
    next(it)
    loader.restore(state)
    assert _ids(it) == reference[1:]


@pytest.mark.parametrize("place_threads", [0, 2])
def test_an_error_while_prefetching_reaches_the_consumer(place_threads):
    def transform(batch):
        if batch["id"].max() > 150:
            raise RuntimeError("bad record")
        return batch

    loader = _loader(prefetch=2, shuffle=False, transform=transform, place_threads=place_threads)
    with pytest.raises(RuntimeError, match="bad record"):
        list(loader)
    assert loader.step == 9  # the 9 batches of ids < 150 were handed out


def test_prefetcher_rejects_a_bad_depth():
    with pytest.raises(ValueError, match="depth=0 must be >= 1"):
        Prefetcher(lambda step: step, start=0, end=3, depth=0, budget_bytes=1 << 20)
    with pytest.raises(ValueError, match=r"prefetch=-1 must be 'auto' \(read-ahead that adapts\)"):
        _loader(prefetch=-1)


class _Slow:
    """ArraySource behind ``latency_s`` per read, each read a random share longer or
    shorter, so reads running together finish out of order."""

    def __init__(self, n: int, latency_s: float) -> None:
        self._inner = meshfeed.ArraySource({"id": np.arange(n), "x": np.ones((n, 256), np.float32)})
        self._latency_s = latency_s
        self._rng = np.random.default_rng(0)
        self.calls_at_once = 0
        self.most_at_once = 0
        self._lock = threading.Lock()

    @property
    def fields(self):
        return self._inner.fields

    def __len__(self):
        return len(self._inner)

    def __getitem__(self, ids):
        with self._lock:
            self.calls_at_once += 1
            self.most_at_once = max(self.most_at_once, self.calls_at_once)
            delay = self._latency_s * self._rng.uniform(0.2, 1.8)
        time.sleep(delay)
        with self._lock:
            self.calls_at_once -= 1
        return self._inner[ids]


def _slow_loader(source, **kwargs):
    mesh = meshfeed.make_mesh(data=8)
    return meshfeed.Loader(
        source, global_batch_size=16, sharding=meshfeed.batch_sharding(mesh), **kwargs
    )


def test_auto_reads_a_slow_source_several_steps_at_once_in_order():
    source = _Slow(1600, latency_s=0.02)
    loader = _slow_loader(source, num_epochs=1)
    got = _ids(loader)
    assert got == _ids(_slow_loader(_Slow(1600, latency_s=0.0), prefetch=0))
    assert loader.prefetch_depth > 4  # deepened from 2 while the loop waited
    assert source.most_at_once > 2  # several reads in flight together


def test_auto_stays_within_prefetch_bytes():
    source = _Slow(1600, latency_s=0.02)
    batch_bytes = 16 * (8 + 256 * 4)
    loader = _slow_loader(source, prefetch_bytes=3 * batch_bytes)
    for _ in loader:
        pass
    assert loader.prefetch_depth == 3
    assert source.most_at_once <= 3


def test_auto_does_not_deepen_for_a_reader_that_computes():
    def busy(batch):  # CPU work in the reading thread: more threads would not help
        end = time.thread_time() + 0.003
        while time.thread_time() < end:
            pass
        return batch

    loader = _slow_loader(meshfeed.ArraySource({"id": np.arange(800)}), transform=busy)
    for _ in loader:
        time.sleep(0.0005)
    # One step deeper at most, if the host stalled the reader once; never the 128 steps
    # that the waits alone and the memory budget would allow.
    assert loader.prefetch_depth <= 3


def test_a_fixed_depth_reads_that_many_at_once():
    source = _Slow(800, latency_s=0.01)
    loader = _slow_loader(source, prefetch=4)
    assert _ids(loader) == _ids(_slow_loader(_Slow(800, latency_s=0.0), prefetch=0))
    assert loader.prefetch_depth == 4 and 2 <= source.most_at_once <= 4


def test_an_error_in_a_step_read_ahead_is_raised_at_that_step():
    class FailsAt(_Slow):
        def __getitem__(self, ids):
            if 500 in ids:
                raise RuntimeError("read of id 500 failed")
            return super().__getitem__(ids)

    loader = _slow_loader(FailsAt(800, latency_s=0.005), shuffle=False, prefetch=6)
    with pytest.raises(RuntimeError, match="read of id 500 failed"):
        list(loader)
    assert loader.step == 500 // 16  # every batch before the failing one was handed out


def test_auto_at_depth_zero_reads_each_step_on_the_consumers_thread_in_order():
    """The climb may settle inline (no hand-off, where a reader thread costs more than
    it hides): the consumer then reads its own steps, an error raised at its step."""
    threads: dict[int, int] = {}

    def produce(step):
        threads[step] = threading.get_ident()
        if step == 40:
            raise RuntimeError("step 40 failed")
        return np.full(4, step)

    ahead = Prefetcher(produce, start=0, end=None, depth=None, budget_bytes=1 << 20)
    try:
        got = [int(next(ahead)[1][0]) for _ in range(10)]
        with ahead._lock:  # where the climb's trial inline puts it
            ahead._climb.depth = 0
            ahead._set_depth(0)
        got += [int(next(ahead)[1][0]) for _ in range(30)]
        assert got == list(range(40))
        here = threading.get_ident()
        assert all(threads[s] == here for s in range(12, 40))  # 10, 11: read ahead before
        assert ahead.ask is not None and ahead.ask[2] == 0
        with pytest.raises(RuntimeError, match="step 40 failed"):
            next(ahead)
        with pytest.raises(StopIteration):
            next(ahead)
    finally:
        ahead.close()


EXITS_WITH_LOADERS_OPEN = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import numpy as np, meshfeed
mesh = meshfeed.make_mesh(data=8)
source = meshfeed.ArraySource({"x": np.arange(4096 * 64, dtype=np.float32).reshape(4096, 64)})
iters = []
for p in (4, "auto") * 6:
    loader = meshfeed.Loader(source, global_batch_size=64, num_epochs=None, prefetch=p,
                             sharding=meshfeed.batch_sharding(mesh))
    iters.append(iter(loader))
    for _ in range(3):
        next(iters[-1])
"""


def test_a_process_that_ends_with_loaders_never_closed_exits():
    """At exit the loaders' generators are closed while their daemon readers are frozen,
    one maybe holding the read-ahead's lock: waiting on it hung the exit in about one
    process of three (this script) before; close() now lets go at once there."""
    for _ in range(3):
        done = subprocess.run(
            [sys.executable, "-c", EXITS_WITH_LOADERS_OPEN], timeout=60, capture_output=True
        )
        assert done.returncode == 0, done.stderr.decode()[-2000:]
