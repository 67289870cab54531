"""Datasets on an S3-compatible server (moto, on 127.0.0.1) read as local ones are."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import meshfeed
import s3_fns
from meshfeed.testing import Proxy, S3Server, run_in_processes
from multiprocess_fns import assemble

N = 100


def _data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"x": rng.normal(size=(N, 4)).astype(np.float32), "id": np.arange(N)}


def _write(server: S3Server, name: str) -> str:
    url = f"s3://data/{name}"
    meshfeed.write_source(url, _data(), shard_size=30, storage_options=server.storage_options)
    return url


def _equal(got: list, want: list) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        for name in w:
            np.testing.assert_array_equal(g[name], w[name])


def test_a_dataset_on_the_server_reads_as_the_local_one(server):
    url = _write(server, "one")
    source = meshfeed.open_source(url, storage_options=server.storage_options)
    assert len(source) == N
    ids = np.array([97, 3, 45, 3, 60])
    for name, values in source[ids].items():
        np.testing.assert_array_equal(values, _data()[name][ids])
    got = assemble([{"batches": s3_fns.stream(source)}])
    want = assemble([{"batches": s3_fns.stream(meshfeed.ArraySource(_data()))}])
    _equal(got, want)


@pytest.mark.multiprocess
def test_two_processes_read_the_server_as_one_reads_local_files(server):
    url = _write(server, "two")
    orders = [{}, {"shuffle_block": 16, "shuffle_window": 2}]  # in the same two processes
    results = run_in_processes(
        s3_fns.stream_from,
        url,
        server.storage_options,
        orders,
        num_processes=2,
        devices_per_process=4,
    )
    for i, order in enumerate(orders):
        got = assemble([{"batches": r[i]} for r in results])
        want = assemble([{"batches": s3_fns.stream(meshfeed.ArraySource(_data()), **order)}])
        _equal(got, want)


def test_parquet_on_the_server(server):
    import fsspec
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"x": _data()["x"][:, 0], "id": _data()["id"]})
    fs, path = fsspec.core.url_to_fs("s3://data/table.parquet", **server.storage_options)
    with fs.open(path, "wb") as f:
        pq.write_table(table, f, row_group_size=25)
    source = meshfeed.sources.ParquetSource(
        "s3://data/table.parquet", storage_options=server.storage_options
    )
    got = source[np.array([99, 0, 50])]
    np.testing.assert_array_equal(got["id"], [99, 0, 50])
    np.testing.assert_array_equal(got["x"], _data()["x"][[99, 0, 50], 0])


def test_a_missing_dataset_is_named(server):
    with pytest.raises(FileNotFoundError, match=r"s3://data/nothing/meshfeed.json does not exist"):
        meshfeed.open_source("s3://data/nothing", storage_options=server.storage_options)


def test_a_shard_gone_after_opening_is_an_error_naming_it(server):
    url = _write(server, "vanishing")
    source = meshfeed.open_source(url, storage_options=server.storage_options)
    import fsspec

    fs, path = fsspec.core.url_to_fs(url, **server.storage_options)
    shard = next(p for p in fs.find(path) if p.endswith(".npy") and "/x/" in p)
    fs.rm(shard)
    with pytest.raises(FileNotFoundError, match=r"s3://data/vanishing/x/.*\.npy does not exist"):
        source[np.arange(N)]


def test_a_truncated_shard_is_refused_naming_it_at_its_first_read(server):
    url = _write(server, "truncated")
    import fsspec

    fs, path = fsspec.core.url_to_fs(url, **server.storage_options)
    shard = next(p for p in fs.find(path) if p.endswith(".npy") and "/x/" in p)
    fs.pipe(shard, fs.cat(shard)[:-7])
    source = meshfeed.open_source(url, storage_options=server.storage_options)  # its catalog
    with pytest.raises(ValueError, match=r"x/.*\.npy is \d+ bytes, its catalog says \d+"):
        source[np.arange(len(source))]


def test_a_store_gone_for_good_is_an_error_within_the_retry_bound(server):
    url = _write(server, "gone")
    proxy = Proxy(server.port)
    options = {**server.storage_options, "endpoint_url": proxy.endpoint}
    source = meshfeed.open_source(url, storage_options=options, retry_s=2)
    proxy.stop()
    start = time.monotonic()
    with pytest.raises(
        OSError,
        match=r"reading s3://data/gone/.* failed: the s3 store at .* has failed for 2\.\d s "
        r"with no success .*unreachable.*pass a larger retry_s \(now 2\)",
    ):
        source[np.arange(10)]
    assert time.monotonic() - start < 8  # 4 shards x 2 fields in flight, on one clock


def test_parquet_outlives_the_store_going_away_for_3_s(server):
    import fsspec
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"x": _data()["x"][:, 0], "id": _data()["id"]})
    fs, path = fsspec.core.url_to_fs("s3://data/outage.parquet", **server.storage_options)
    with fs.open(path, "wb") as f:
        pq.write_table(table, f, row_group_size=10)
    proxy = Proxy(server.port)
    options = {**server.storage_options, "endpoint_url": proxy.endpoint}
    source = meshfeed.sources.ParquetSource(
        "s3://data/outage.parquet", storage_options=options, retry_s=30, cache_bytes=0
    )
    np.testing.assert_array_equal(source[np.arange(10)]["id"], np.arange(10))
    proxy.stop()
    threading.Timer(3.0, proxy.start).start()
    start = time.monotonic()
    got = source[np.arange(N)]
    assert time.monotonic() - start > 2.5
    np.testing.assert_array_equal(got["id"], np.arange(N))
    np.testing.assert_array_equal(got["x"], _data()["x"][:, 0])
    proxy.stop()


def test_rows_near_each_other_are_one_request(server):
    url = _write(server, "coalesced")
    source = meshfeed.open_source(url, storage_options=server.storage_options)
    before = source.requests
    ids = np.array([6, 0, 4, 2, 31, 35, 33])  # 4 rows of shard 0, 3 of shard 1: no runs
    got = source[ids]
    np.testing.assert_array_equal(got["x"], _data()["x"][ids])
    # One request per shard and field (2 x 2), not one per row (7 x 2).
    assert source.requests - before == 4
    assert source.bytes_fetched >= source.bytes_read


def test_merge_joins_ranges_closer_than_the_gap():
    from meshfeed.storage._remote import MAX_GAP, merge

    far = 10 * MAX_GAP
    requests = merge([far, 0, 100, 100], [far + 8, 10, 200, 150])
    assert requests == [(0, 200, [1, 2, 3]), (far, far + 8, [0])]
