"""Hedged range reads: a slow read gets one duplicate, within a budget, and the bytes stay.

The store is the local S3 server behind a ``CountingProxy`` that holds a share of the
range reads (each chosen at random, a duplicate too); the ``Hedger``'s rules are also
driven with a clock of the test's own.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np
import pytest

import meshfeed
from meshfeed.storage._clock import StoreClock
from meshfeed.storage._hedge import BUDGET, MIN_LATENCIES, Hedger
from meshfeed.storage._remote import FETCHES
from meshfeed.testing import CountingProxy


@pytest.fixture
def proxy(server):
    counting = CountingProxy(server.port)
    yield counting
    counting.close()


def _hedger(latency_s: float = 0.01) -> Hedger:
    hedger = Hedger(StoreClock("a test store"))
    for i in range(MIN_LATENCIES):
        hedger.answered(hedger.sent(float(i)), latency_s)
    return hedger


def test_a_hedge_waits_for_a_quantile_of_recent_answers_and_stays_in_its_budget():
    assert Hedger(StoreClock("s")).delay() is None  # no answers yet: nothing is hedged
    hedger = _hedger(0.2)
    assert hedger.delay() == pytest.approx(0.4)  # twice the p95
    assert _hedger(0.001).delay() == pytest.approx(0.05)  # the floor
    now = 100.0
    for _ in range(100):
        hedger.answered(hedger.sent(now), None)
    allowed = sum(hedger.may_hedge(now) for _ in range(20))
    assert allowed == int(BUDGET * 100)  # the 100 just sent (the first 32 are 69 s old)
    # Thirty seconds on, the window holds none of them: no budget until requests come.
    assert not hedger.may_hedge(now + 31.0)


def test_many_slow_reads_at_once_are_an_outage_and_get_no_duplicate():
    hedger = _hedger(0.01)
    for _ in range(400):  # a budget to spend
        hedger.answered(hedger.sent(0.0), None)
    tokens = [hedger.sent(1.0) for _ in range(8)]  # eight reads in flight
    assert not hedger.may_hedge(2.0)  # all eight overdue: an outage, not a tail
    for token in tokens[:6]:
        hedger.answered(token, None)
    assert hedger.may_hedge(2.0)  # two overdue: a tail
    failing = _hedger(0.01)
    for _ in range(400):
        failing.answered(failing.sent(0.0), None)
    with failing.clock.attempt("x", 60.0) as attempt:
        attempt.failed(ConnectionError("refused"))
    assert not failing.may_hedge(0.5)  # the store fails: the clock's probes ask it


@pytest.fixture(scope="module")
def url(server) -> str:
    """One folder for the tests below, written once (64 shards: 5 s); each reads it through
    a proxy of its own, so a hedger and a clock of its own (a store's, named by endpoint)."""
    rng = np.random.default_rng(0)
    data = {
        "x": rng.integers(0, 255, (64 * 32, 64), dtype=np.uint8),
        "y": np.arange(64 * 32, dtype=np.int32),
    }
    url = "s3://data/hedged"
    meshfeed.write_source(url, data, shard_size=32, storage_options=server.storage_options)
    return url


def _batches(url: str, options: dict[str, Any], steps: int, **kw: Any) -> list[np.ndarray]:
    source = meshfeed.open_source(url, storage_options=options, **kw)
    loader = meshfeed.Loader(
        source, global_batch_size=32, num_epochs=None, shuffle=True, seed=1,
        sharding=meshfeed.batch_sharding(meshfeed.make_mesh(data=8)),
    )  # fmt: skip
    it = iter(loader)
    try:
        return [np.asarray(jax.device_get(next(it)["y"])) for _ in range(steps)]
    finally:
        loader.close()


def test_a_slow_tail_is_hedged_within_the_budget_and_the_batches_do_not_change(server, url, proxy):
    options = {**server.storage_options, "endpoint_url": proxy.endpoint}
    before = FETCHES.values()  # the clean run's requests count in the budget's window too
    clean = _batches(url, options, 8, hedge=False)
    proxy.hold("range", 0.03, 2.0, seed=3)  # 3% of range reads held 2 s
    held = _batches(url, options, 8)
    got = {k: FETCHES.values()[k] - before[k] for k in ("requests", "hedges", "hedges_won")}
    assert proxy.held > 0
    np.testing.assert_array_equal(np.stack(held), np.stack(clean))
    assert got["hedges_won"] >= 1, got  # a held read was answered by its duplicate
    assert got["hedges"] <= BUDGET * got["requests"], got


def test_in_an_outage_duplicates_stay_in_the_budget_and_the_clock_raises(server, url, proxy):
    options = {
        **server.storage_options,
        "endpoint_url": proxy.endpoint,
        "config_kwargs": {"read_timeout": 1, "retries": {"total_max_attempts": 1}},
    }
    source = meshfeed.open_source(url, storage_options=options, retry_s=3.0)
    before = FETCHES.values()
    ids = np.random.default_rng(2).permutation(len(source))
    for chunk in np.array_split(ids[:512], 16):  # answers to learn the store's latency from
        source[np.sort(chunk)]
    proxy.hold("range", 1.0, 30.0)  # every range read held past the read timeout
    with pytest.raises(OSError, match="has failed for"):
        for chunk in np.array_split(ids[512:], 16):
            source[np.sort(chunk)]
    got = {k: FETCHES.values()[k] - before[k] for k in ("requests", "hedges")}
    assert got["hedges"] <= BUDGET * got["requests"], got


def test_reads_that_wait_on_a_store_are_read_ahead_past_its_usual_wait(server, url, proxy):
    """Part 3: every range read answers 50 ms late, the loop computes 10 ms a step: the
    read-ahead starts deep with a thread a step, and stays at least 1 + 50/10 deep."""
    options = {**server.storage_options, "endpoint_url": proxy.endpoint}
    source = meshfeed.open_source(url, storage_options=options)
    loader = meshfeed.Loader(
        source, global_batch_size=8, num_epochs=None, shuffle=True, seed=1,
        sharding=meshfeed.batch_sharding(meshfeed.make_mesh(data=8)),
    )  # fmt: skip
    proxy.hold("range", 1.0, 0.05)
    try:
        it = iter(loader)
        for _ in range(48):
            jax.block_until_ready(next(it))
            time.sleep(0.01)  # the step's compute
        ahead = loader.stats()["consumer"]["read_ahead"]
    finally:
        loader.close()
    assert ahead["moves"][0]["why"] == "start: the first reads waited on a store", ahead
    assert ahead["depth"] >= 6, ahead
    assert ahead["threads"] > 2, ahead  # a thread a step, not one a core: the reads wait
