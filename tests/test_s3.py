"""Datasets on an S3-compatible server (moto, on 127.0.0.1) read as local ones are."""

from __future__ import annotations

import numpy as np
import pytest

import meshfeed
import s3_fns
from meshfeed.testing import run_in_processes
from multiprocess_fns import assemble
from s3_server import S3Server

N = 100


@pytest.fixture(scope="module")
def server():
    s3 = S3Server()
    s3.make_bucket("data")
    yield s3
    s3.close()


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
    results = run_in_processes(
        s3_fns.stream_from, url, server.storage_options, num_processes=2, devices_per_process=4
    )
    got = assemble([{"batches": r} for r in results])
    want = assemble([{"batches": s3_fns.stream(meshfeed.ArraySource(_data()))}])
    _equal(got, want)


def test_parquet_on_the_server(server):
    import fsspec
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"x": _data()["x"][:, 0], "id": _data()["id"]})
    fs, path = fsspec.core.url_to_fs("s3://data/table.parquet", **server.storage_options)
    with fs.open(path, "wb") as f:
        pq.write_table(table, f, row_group_size=25)
    source = meshfeed.ParquetSource(
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


def test_a_truncated_shard_is_refused_naming_it(server):
    url = _write(server, "truncated")
    import fsspec

    fs, path = fsspec.core.url_to_fs(url, **server.storage_options)
    shard = next(p for p in fs.find(path) if p.endswith(".npy") and "/x/" in p)
    fs.pipe(shard, fs.cat(shard)[:-7])
    with pytest.raises(ValueError, match=r"x/.*\.npy is \d+ bytes, the manifest says \d+"):
        meshfeed.open_source(url, storage_options=server.storage_options)
