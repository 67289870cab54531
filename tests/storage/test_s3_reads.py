"""What a dataset on the server costs to read: the local cache, and what plan reports."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys

import numpy as np
import pytest

import meshfeed
from meshfeed.testing import S3Server

N = 2000


def _data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"x": rng.normal(size=(N, 16)).astype(np.float32), "id": np.arange(N)}


def _write(server: S3Server, name: str, data: dict[str, np.ndarray] | None = None) -> str:
    url = f"s3://data/{name}"
    data = _data() if data is None else data
    meshfeed.write_source(url, data, shard_size=500, storage_options=server.storage_options)
    return url


def test_a_cache_reads_each_shard_from_the_store_once(server, tmp_path):
    url = _write(server, "cached")
    source = meshfeed.open_source(
        url, storage_options=server.storage_options, cache_dir=tmp_path / "cache"
    )
    ids = np.random.default_rng(0).permutation(N)
    opened = source.requests  # each file's header
    first = source[ids]
    fetched = (source.requests, source.bytes_fetched)
    assert fetched[0] - opened == 8  # 4 shards x 2 fields, each downloaded whole at once
    again = source[ids[::-1]]
    assert (source.requests, source.bytes_fetched) == fetched  # from the local copies
    for name, values in _data().items():
        np.testing.assert_array_equal(first[name], values[ids])
        np.testing.assert_array_equal(again[name], values[ids[::-1]])
    assert len(list((tmp_path / "cache").iterdir())) == 8


def test_loader_stats_count_the_requests_and_the_cache_hits_of_a_url(server, tmp_path):
    url = _write(server, "counted")
    source = meshfeed.open_source(
        url, storage_options=server.storage_options, cache_dir=tmp_path / "cache"
    )
    opened = (source.requests, source.bytes_fetched)
    loader = _loader(source, num_epochs=2)
    steps = len(list(loader))
    stats = loader.stats()["source"]
    assert stats["records"] == steps * 64 and stats["reads"] == steps
    fetched = stats["url"]
    assert fetched["requests"] == source.requests - opened[0] == 8  # 4 shards x 2 fields
    assert fetched["bytes"] == source.bytes_fetched - opened[1]
    assert fetched["cache_downloads"] == 8 and fetched["retries"] == 0
    assert fetched["cache_hits"] >= steps  # each step reads from the local copies


def test_a_cache_stays_within_its_bound_and_still_reads_right(server, tmp_path):
    url = _write(server, "bounded")
    bound = 500 * 16 * 4 + 500 * 8 + 256  # one shard's two files, headers included
    source = meshfeed.open_source(
        url, storage_options=server.storage_options, cache_dir=tmp_path, cache_bytes=bound
    )
    opened = source.requests
    cache_bytes = []
    for shard in itertools.chain(range(4), range(4)):
        ids = np.arange(shard * 500, shard * 500 + 500)
        got = source[ids]
        np.testing.assert_array_equal(got["x"], _data()["x"][ids])
        cache_bytes.append(sum(p.stat().st_size for p in tmp_path.iterdir()))
    assert max(cache_bytes) <= bound
    assert source.requests - opened == 16  # evicted copies were downloaded again


def test_a_rewritten_dataset_is_not_read_from_an_old_copy(server, tmp_path):
    url = _write(server, "rewritten")
    options = server.storage_options
    old = meshfeed.open_source(url, storage_options=options, cache_dir=tmp_path)
    old[np.arange(N)]
    new_data = {k: v[::-1].copy() for k, v in _data().items()}
    import fsspec

    fs, path = fsspec.core.url_to_fs(url, **options)
    fs.rm(path, recursive=True)
    _write(server, "rewritten", new_data)
    new = meshfeed.open_source(url, storage_options=options, cache_dir=tmp_path)
    np.testing.assert_array_equal(new[np.arange(N)]["id"], new_data["id"])


def test_a_cache_for_a_local_path_is_refused(tmp_path):
    meshfeed.write_source(tmp_path / "ds", {"x": np.arange(4)})
    with pytest.raises(ValueError, match="is a local path already; drop cache_dir"):
        meshfeed.open_source(tmp_path / "ds", cache_dir=tmp_path / "cache")


def _loader(source, **kwargs):
    mesh = meshfeed.make_mesh(data=8)
    return meshfeed.Loader(
        source,
        global_batch_size=64,
        sharding=meshfeed.batch_sharding(mesh),
        prefetch=0,
        **kwargs,
    )


def test_plan_reports_the_requests_and_bytes_a_step_fetches(server):
    url = _write(server, "planned")
    source = meshfeed.open_source(url, storage_options=server.storage_options)
    per_step = {}
    for order in ({}, {"shuffle_block": 100, "shuffle_window": 4}):
        loader = _loader(source, **order)
        fetches = loader.plan.fetches
        assert fetches is not None and fetches.url == url and fetches.steps == 8
        before = (source.requests, source.bytes_fetched)
        for _ in itertools.islice(loader, 8):
            pass
        measured = (source.requests - before[0], source.bytes_fetched - before[1])
        assert (fetches.requests * 8, fetches.bytes * 8) == measured
        assert "range requests" in meshfeed.show_plan(loader.plan)
        per_step[bool(order)] = fetches
    # Blocks of consecutive rows: fewer requests, and fewer bytes fetched only to be
    # dropped (single rows far apart make whole shards one request each).
    assert per_step[True].requests < per_step[False].requests
    assert per_step[True].bytes < per_step[False].bytes / 4
    assert _loader(meshfeed.ArraySource(_data())).plan.fetches is None


def test_meshfeed_plan_data_prints_what_a_step_fetches(tmp_path):
    meshfeed.write_source(tmp_path / "ds", _data(), shard_size=500)
    run = subprocess.run(
        [
            *(sys.executable, "-m", "meshfeed", "plan", "--mesh", "data=8", "--spec", "data"),
            *("--data", f"file://{tmp_path}/ds", "--batch", "64", "--shuffle-block", "100"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert f"from file://{tmp_path}/ds:" in run.stdout
    assert re.search(r"\d+\.\d range requests and [\d.]+ KiB per step", run.stdout)
