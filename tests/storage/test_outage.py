"""A store's outage runs on one clock per store: ``retry_s`` since the last success.

The clock itself with a fake store (threads, no server), then the S3 server on
127.0.0.1 behind a proxy that goes away: for 3 s (the stream goes on, the same), and
for good (every process raises within ``retry_s`` + 20 s, naming the object).
"""

from __future__ import annotations

import functools
import os
import re
import threading
import time

import numpy as np
import pytest

import meshfeed
import s3_fns
from meshfeed.storage._clock import StoreClock
from meshfeed.storage._remote import (
    REMOTE_READS,
    bound_inner_retries,
    reader_options,
    with_retries,
)
from meshfeed.testing import Proxy, S3Server, run_in_processes
from multiprocess_fns import assemble

N = 512
SHARD = 8  # small shards: a step of 32 rows reads some 20 of them, each field


def _data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"x": rng.normal(size=(N, 4)).astype(np.float32), "id": np.arange(N)}


def _write(server: S3Server, name: str) -> str:
    url = f"s3://data/outage/{name}"
    meshfeed.write_source(url, _data(), shard_size=SHARD, storage_options=server.storage_options)
    return url


class FakeStore:
    """A call that fails (``ConnectionError``) while ``down`` is set, and counts how many
    calls are in flight at once while it is down."""

    def __init__(self) -> None:
        self.down = threading.Event()
        self.lock = threading.Lock()
        self.in_flight = 0
        self.most_in_flight_while_down = 0
        self.calls = 0

    def read(self, value: int) -> int:
        with self.lock:
            self.in_flight += 1
            self.calls += 1
            if self.down.is_set():
                self.most_in_flight_while_down = max(self.most_in_flight_while_down, self.in_flight)
        try:
            time.sleep(0.01)
            if self.down.is_set():
                raise ConnectionError("refused")
            return value
        finally:
            with self.lock:
                self.in_flight -= 1


def _fail_once(clock: StoreClock) -> None:
    """Starts an outage on ``clock`` (as a read in flight when the store went away)."""
    with clock.attempt("s3://bucket/first", retry_s=60) as attempt:
        attempt.failed(ConnectionError("refused"))


def test_readers_of_a_failing_store_probe_one_at_a_time_and_a_success_resets_the_clock():
    clock, store = StoreClock("the test store"), FakeStore()
    store.down.set()
    _fail_once(clock)
    results: list[int] = []

    def reader(k: int) -> None:
        for value in (10 * k, 10 * k + 1, 10 * k + 2):
            results.append(
                with_retries(functools.partial(store.read, value), "x", retry_s=5, clock=clock)
            )

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.6)
    assert clock.failing_for > 0.5 and clock.attempts >= 3
    store.down.clear()  # the store is back: the next probe succeeds, everyone goes
    for t in threads:
        t.join(timeout=10)
    assert sorted(results) == [0, 1, 2, 10, 11, 12]  # every read once, the right value
    assert store.most_in_flight_while_down == 1  # one probe at a time, never both readers
    assert store.calls < 20  # backed off: 0.05 s doubling, not a call per 10 ms each
    assert clock.failing_for == 0.0 and clock.attempts == 0  # a success resets the clock
    # Failing for 0.6 s twice, with a success in between, is two outages, not 1.2 s.
    _fail_once(clock)
    time.sleep(0.6)
    assert with_retries(lambda: 7, "x", retry_s=1.0, clock=clock) == 7
    _fail_once(clock)
    time.sleep(0.6)
    assert clock.failing_for < 1.0
    assert with_retries(lambda: 8, "x", retry_s=1.0, clock=clock) == 8


def test_every_reader_of_a_store_gone_for_good_raises_at_the_clock_naming_its_object():
    clock, store = StoreClock("the test store"), FakeStore()
    store.down.set()
    errors: dict[int, BaseException] = {}
    took: dict[int, float] = {}
    start = time.monotonic()

    def reader(k: int) -> None:
        try:
            with_retries(lambda: store.read(k), f"s3://bucket/{k}.npy", retry_s=1.0, clock=clock)
        except OSError as error:
            errors[k], took[k] = error, time.monotonic() - start

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert sorted(errors) == [0, 1, 2, 3]
    for k, error in errors.items():
        assert re.fullmatch(
            rf"reading s3://bucket/{k}\.npy failed: the test store has failed for 1\.\d s "
            r"with no success \(\d+ attempts\); the last error: ConnectionError: refused\. "
            r"The store is unreachable or failing: check it \(and storage_options\), or pass "
            r"a larger retry_s \(now 1\) to outlive a longer outage\.",
            str(error),
        ), str(error)
        assert isinstance(error.__cause__, ConnectionError)
        assert took[k] < 1.5  # together, at the clock, not one reader after another


def test_a_failing_store_says_so_on_stderr_once_per_interval_not_per_reader(capsys):
    clock, store = StoreClock("the test store", log_every_s=0.25), FakeStore()
    store.down.set()

    def reader(k: int) -> None:
        with pytest.raises(OSError, match="has failed for"):
            with_retries(lambda: store.read(k), f"s3://bucket/{k}", retry_s=1.0, clock=clock)

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    lines = capsys.readouterr().err.splitlines()
    # At 0.25, 0.5 and 0.75 s (1.0 s is the end): one line each, not one per reader.
    assert 2 <= len(lines) <= 4, lines
    for line in lines:
        assert re.fullmatch(
            r"meshfeed: the test store has failed for \d s \(\d+ attempts\), reading "
            r"s3://bucket/\d; the last error: ConnectionError: refused; giving up in \d s "
            r"\(retry_s=1\)\.",
            line,
        ), line
    with pytest.raises(ValueError, match=r"log_every_s=0 must be > 0"):
        StoreClock("the test store", log_every_s=0)


def test_a_permanent_error_raises_at_once_and_lets_the_next_reader_probe():
    clock = StoreClock("the test store")
    _fail_once(clock)

    def missing() -> bytes:
        raise FileNotFoundError("no such key")

    start = time.monotonic()
    with pytest.raises(FileNotFoundError, match=r"s3://bucket/gone does not exist"):
        with_retries(missing, "s3://bucket/gone", retry_s=30, clock=clock)
    assert with_retries(lambda: 1, "s3://bucket/here", retry_s=30, clock=clock) == 1
    assert time.monotonic() - start < 1


def test_the_s3_client_retries_are_off_unless_the_options_set_them(server):
    options = reader_options("s3://data/x", server.storage_options)
    assert options["config_kwargs"] == {
        "retries": {"total_max_attempts": 1},
        "connect_timeout": 5,
        "read_timeout": 20,
        "max_pool_connections": REMOTE_READS,  # a connection for each read in flight
    }
    assert {k: v for k, v in options.items() if k != "config_kwargs"} == server.storage_options
    mine = {**server.storage_options, "config_kwargs": {"retries": {"max_attempts": 7}}}
    mine["config_kwargs"]["max_pool_connections"] = 8
    kept = reader_options("s3://data/x", mine)["config_kwargs"]
    assert kept["max_pool_connections"] == 8
    assert kept["retries"] == {"max_attempts": 7} and kept["read_timeout"] == 20
    assert reader_options("memory://x", {"a": 1}) == {"a": 1}
    import fsspec

    fs, _ = fsspec.core.url_to_fs("s3://data/x", **options)
    bound_inner_retries(fs)
    assert fs.retries == 1
    assert fsspec.core.url_to_fs("s3://data/x", **server.storage_options)[0].retries == 5


def test_the_stream_outlives_the_store_going_away_for_3_s(server):
    url = _write(server, "outage3")
    proxy = Proxy(server.port)
    options = {**server.storage_options, "endpoint_url": proxy.endpoint}
    source = meshfeed.open_source(url, storage_options=options, retry_s=20)
    loader = s3_fns.make_loader(source, global_batch_size=32, prefetch=2)
    seen: list[int] = []
    went = back = 0.0
    for step, batch in enumerate(loader):
        seen += np.asarray(batch["id"])[np.asarray(batch["mask"])].tolist()
        if step == 3:
            proxy.stop()
            went = time.monotonic()
            threading.Timer(3.0, proxy.start).start()
        back = time.monotonic()
    assert back - went > 2.5  # the reads waited the outage out
    url = loader.stats()["source"]["url"]
    assert url["retries"] > 0 and url["requests"] > url["retries"]  # loader.stats saw them
    assert sorted(seen) == list(range(N))  # every example exactly once
    want = assemble(
        [{"batches": s3_fns.stream(meshfeed.ArraySource(_data()), global_batch_size=32)}]
    )
    assert seen == [i for b in want for i in b["id"][b["mask"]].tolist()]
    proxy.stop()


@pytest.mark.multiprocess
def test_a_store_gone_for_good_is_an_error_on_every_process_within_retry_s(server, tmp_path):
    url = _write(server, "gone")
    proxy = Proxy(server.port)
    options = {**server.storage_options, "endpoint_url": proxy.endpoint}

    def take_the_store_away() -> None:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("ready-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        proxy.stop()
        (tmp_path / "stopped.tmp").write_text(repr(time.time()))
        os.replace(tmp_path / "stopped.tmp", tmp_path / "stopped")

    threading.Thread(target=take_the_store_away, daemon=True).start()
    results = run_in_processes(
        s3_fns.read_until_gone, url, options, str(tmp_path), 8.0, num_processes=2
    )
    for message, seconds, per_step in results:
        print(f"error after {seconds:.1f} s ({per_step:g} requests a step): {message}")
        assert per_step >= 8  # many objects in flight, each waiting on the one clock
        assert re.match(
            rf"reading s3://data/outage/gone/(x|id)/\d+\.npy failed: the s3 store at "
            rf"{proxy.endpoint} has failed for \d+\.\d s with no success",
            message,
        ), message
        assert "retry_s (now 8)" in message
        assert 7.5 < seconds < 25
