"""Pod-scale start-up: a host opens any dataset from its catalog with a few requests,
whatever its file count, checks each file at its first read, keeps a bounded number of
files open, and ``meshfeed plan`` says what N hosts will ask of the store.

Requests are counted by a ``CountingProxy`` between the readers and a local S3 server:
every request the store sees, HEADs and listings included.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import s3fs

import meshfeed
from formats_fns import payload
from meshfeed.core._lru import SizedLRU
from meshfeed.storage import _handles
from meshfeed.storage._blob import Blob, TruncatedError
from meshfeed.storage._handles import Handles
from meshfeed.testing import CountingProxy

HELPERS = Path(__file__).resolve().parents[1] / "helpers"


@pytest.fixture(scope="module")
def proxy(server):
    counting = CountingProxy(server.port)
    yield counting
    counting.close()


def _options(server, proxy):
    return {**server.storage_options, "endpoint_url": proxy.endpoint}


def _upload(server, local: Path, url: str) -> None:
    """A local folder to the store, every file at once (s3fs's own concurrency)."""
    s3fs.S3FileSystem(**server.storage_options).put(str(local), url, recursive=True)


def _folder(tmp: Path, shards: int) -> Path:
    rows = 2 * shards
    data = {"x": np.arange(rows, dtype=np.int32), "y": np.ones((rows, 3), np.float32)}
    meshfeed.write_source(tmp / "d", data, shard_size=2)
    return tmp / "d"


def _tars(tmp: Path, shards: int) -> Path:
    folder = tmp / "tars"
    folder.mkdir()
    for s in range(shards):
        with tarfile.open(folder / f"shard-{s:05d}.tar", "w") as tar:
            for i in (2 * s, 2 * s + 1):
                for ext, data in (("txt", payload(i)), ("cls", str(i % 10).encode())):
                    info = tarfile.TarInfo(f"{i:06d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, __import__("io").BytesIO(data))
    return folder


def _parquets(tmp: Path, files: int) -> Path:
    folder = tmp / "pq"
    folder.mkdir()
    for f in range(files):
        table = pa.table({"x": np.arange(2 * f, 2 * f + 2), "tok": [[f, f], [f, f + 1]]})
        pq.write_table(table, folder / f"train-{f:05d}.parquet")
    return folder


def _catalogued(server, folder: Path, pattern: str, name: str) -> str:
    """``folder``'s files indexed (tar: indexes and the catalog; Parquet: the footers'
    catalog only) and uploaded; their URL."""
    meshfeed.index(str(folder / pattern), progress=False)
    url = f"s3://data/{name}"
    _upload(server, folder, url)
    return url


def _startup(proxy, open_it) -> tuple[dict[str, int], object]:
    proxy.reset()
    source = open_it()
    return proxy.counts(), source


@pytest.mark.parametrize("shards", [8, 512])
def test_a_folder_opens_with_one_request_whatever_its_shard_count(server, proxy, tmp_path, shards):
    url = f"s3://data/catalog-folder-{shards}"
    _upload(server, _folder(tmp_path, shards), url)
    options = _options(server, proxy)
    counts, source = _startup(proxy, lambda: meshfeed.open_source(url, storage_options=options))
    assert counts["total"] == 1 and counts["range"] == 1  # the catalog, read whole
    assert counts["head"] == counts["list"] == 0
    assert len(source) == 2 * shards  # type: ignore[arg-type]
    proxy.reset()
    got = source[np.array([0, 2 * shards - 1])]  # type: ignore[index]
    assert got["x"].tolist() == [0, 2 * shards - 1]
    # Each file's first read: one range for the file's header (uploaded without ETags:
    # their catalog has no version to compare) and one for its rows; 2 shards x 2 fields.
    assert proxy.counts()["total"] == 2 * 2 * 2 and proxy.counts()["head"] == 0


@pytest.mark.parametrize("shards", [8, 256])
def test_indexed_tar_shards_open_from_their_catalog(server, proxy, tmp_path, shards):
    url = _catalogued(server, _tars(tmp_path, shards), "*.tar", f"catalog-tars-{shards}")
    options = _options(server, proxy)
    counts, source = _startup(
        proxy, lambda: meshfeed.sources.TarSource(f"{url}/*.tar", storage_options=options)
    )
    assert counts["total"] == 1 and counts["list"] == counts["head"] == 0
    assert len(source) == 2 * shards  # type: ignore[arg-type]
    proxy.reset()
    got = source[np.array([1, 2 * shards - 2])]  # type: ignore[index]
    assert got["txt"].tolist() == [payload(1), payload(2 * shards - 2)]
    # A shard's first read: its sidecar index in one GET (no HEAD for its size), then
    # the sample's bytes; two shards.
    assert proxy.counts()["head"] == 0 and proxy.counts()["total"] == 2 * 2
    if shards == 8:  # what meshfeed plan says of it: one request, every shard, every host
        plan = meshfeed.inspect.plan(
            meshfeed.batch_sharding(meshfeed.make_mesh(data=8)), data=f"{url}/*.tar",
            processes=4096, global_batch_size=8, storage_options=options,
        )  # fmt: skip
        assert plan.pod is not None and (plan.pod.first_read, plan.pod.files) == (1, shards)
        assert (
            "a shard's first read: 1 request(s) before its data; over all 8 shards, 8 a "
            "process and 32,768 for the pod" in meshfeed.show_plan(plan)
        )


@pytest.mark.parametrize("files", [8, 256])
def test_parquet_files_open_from_their_catalog(server, proxy, tmp_path, files):
    url = _catalogued(server, _parquets(tmp_path, files), "*.parquet", f"catalog-pq-{files}")
    options = _options(server, proxy)
    counts, source = _startup(
        proxy,
        lambda: meshfeed.sources.ParquetSource(f"{url}/train-*.parquet", storage_options=options),
    )
    assert counts["total"] == 1 and counts["list"] == counts["head"] == 0
    assert len(source) == 2 * files  # type: ignore[arg-type]
    assert source.fields["tok"] == meshfeed.sources.FieldSpec((2,), np.dtype(np.int64))  # type: ignore[attr-defined]
    got = source[np.array([2 * files - 1, 0])]  # type: ignore[index]
    assert got["x"].tolist() == [2 * files - 1, 0]


def test_data_without_a_catalog_opens_as_before_and_says_so_once(tmp_path, capsys):
    folder = _tars(tmp_path, 3)
    meshfeed.index(str(folder / "*.tar"), progress=False)
    (folder / "meshfeed.catalog.json").unlink()
    sources = [meshfeed.sources.TarSource(str(folder / "*.tar")) for _ in range(2)]
    err = capsys.readouterr().err
    assert err.count("has no catalog (3 tar files)") == 1
    assert f"`meshfeed index '{folder}/*.tar'`" in err  # quoted for a shell
    assert sources[1][np.array([5])]["txt"].tolist() == [payload(5)]


def test_a_catalog_in_an_index_dir_over_several_kinds_serves_each_kind(tmp_path, capsys):
    tars = _tars(tmp_path, 3)
    lines = tmp_path / "part-0.jsonl"
    lines.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(5)))
    index_dir = tmp_path / "indexes"  # away from the data: the catalog names files whole
    meshfeed.index([str(tars / "*.tar"), str(lines)], index_dir=index_dir, progress=False)
    catalog = json.loads((index_dir / "meshfeed.catalog.json").read_text())
    assert catalog["kind"] == "mixed"
    assert all(os.path.isabs(e["path"]) for e in catalog["files"])
    tar = meshfeed.sources.TarSource(str(tars / "*.tar"), index_dir=index_dir)
    jsonl = meshfeed.sources.JsonlSource(str(lines), index_dir=index_dir)
    assert "has no catalog" not in capsys.readouterr().err  # each kind found its entries
    assert tar[np.array([5])]["txt"].tolist() == [payload(5)]
    assert len(jsonl) == 5


def test_a_folder_from_before_catalogs_gets_one_from_meshfeed_index(tmp_path, capsys):
    path = _folder(tmp_path, 4)
    manifest = json.loads((path / "meshfeed.json").read_text())
    for shard in manifest["shards"]:  # as an older build wrote it
        for info in shard["files"].values():
            del info["offset"], info["rows"]
    (path / "meshfeed.json").write_text(json.dumps(manifest))
    before = meshfeed.open_source(path)[np.arange(8)]
    assert "its manifest is from before catalogs" in capsys.readouterr().err
    out = subprocess.run(
        [sys.executable, "-m", "meshfeed", "index", str(path)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    after = meshfeed.open_source(path)[np.arange(8)]
    assert capsys.readouterr().err == ""
    for name in before:
        np.testing.assert_array_equal(before[name], after[name])
    assert all("offset" in i for s in json.loads((path / "meshfeed.json").read_text())["shards"]
               for i in s["files"].values())  # fmt: skip


def test_a_shard_rewritten_after_its_catalog_is_refused_by_name_at_its_first_read(
    server, proxy, tmp_path
):
    url = "s3://data/catalog-rewritten"
    options = _options(server, proxy)
    data = {"x": np.arange(12, dtype=np.int32)}
    meshfeed.write_source(url, data, shard_size=4, storage_options=options)  # with ETags
    fs: Any = s3fs.S3FileSystem(**server.storage_options)
    first = fs.cat_file(f"{url}/x/00001.npy")
    fs.pipe(f"{url}/x/00001.npy", first + b"\0" * 16)  # 16 bytes more
    source = meshfeed.open_source(url, storage_options=options)  # the catalog only
    assert source[np.array([0, 11])]["x"].tolist() == [0, 11]
    with pytest.raises(ValueError, match=r"x/00001.npy is \d+ bytes, its catalog says"):
        source[np.array([5])]
    same_size = fs.cat_file(f"{url}/x/00002.npy")
    fs.pipe(f"{url}/x/00002.npy", same_size[:-1] + b"\x7f")  # same size, new ETag
    with pytest.raises(ValueError, match=r"x/00002.npy has ETag .* its catalog says"):
        meshfeed.open_source(url, storage_options=options)[np.array([9])]


def test_a_folder_of_4000_shards_reads_under_1024_open_files(tmp_path):
    """Two epochs with a global shuffle under a soft RLIMIT_NOFILE of 1,024 (a descriptor
    a shard would fail with EMFILE): at most 128 files open, and the batches of a run with
    the bound raised."""
    rows = 4_000
    meshfeed.write_source(
        tmp_path / "d",
        {"x": np.arange(2 * rows, dtype=np.int32).reshape(rows, 2), "y": np.arange(rows)},
        shard_size=1,
    )
    runs = [
        _run_bounded(tmp_path / "d", soft=1024, max_open_files=None),
        _run_bounded(tmp_path / "d", soft=None, max_open_files=100_000),
    ]
    assert runs[0]["digest"] == runs[1]["digest"] and runs[0]["steps"] == 2 * (rows // 512)
    assert runs[0]["most_fds"] <= 128 < runs[1]["most_fds"]


def _run_bounded(path: Path, *, soft: int | None, max_open_files: int | None) -> dict:
    args = [str(path), str(soft or 0), str(max_open_files or 0)]
    out = subprocess.run(
        [sys.executable, str(HELPERS / "open_files_job.py"), *args], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_pool_of_open_files_closes_the_least_recently_used_and_never_a_pinned_one():
    opened: list[int] = []
    pool = Handles()
    pool.ask(2)

    def opener() -> int:
        fd = os.open(os.devnull, os.O_RDONLY)
        opened.append(fd)
        return fd

    with pool.use(1, opener), pool.use(2, opener):
        pass
    with pool.use(1, opener), pool.use(3, opener):  # 1 the most recent, pinned: 2 goes
        assert len(pool) == 2
    assert pool.opened == 3 and len(pool) == 2

    def collected(key: int):  # the collector runs a Blob's finalizer inside pin
        def opener_forgetting() -> int:
            pool.forget(key)
            return opener()

        return opener_forgetting

    with pool.use(4, collected(3)):  # no deadlock (1 made room; 3 is closed at the next pin)
        assert len(pool) == 2
    with pool.use(4, opener):
        assert len(pool) == 1
    with pytest.raises(ValueError, match=r"max_open_files=0 must be an int >= 1"):
        meshfeed.open_source(os.devnull, max_open_files=0)


def test_a_sized_lru_keeps_its_budget_dropping_the_least_recently_used():
    """What loaded indexes (``index_bytes``) and held files are kept in."""
    kept = SizedLRU(10, len)
    for key, value in enumerate([b"aaaa", b"bbbb", b"cc"]):
        kept.put(key, value)
    assert kept.get(0) == b"aaaa" and kept.bytes == 10  # 0 is now the most recent
    kept.put(3, b"ddd")  # over by 3: 1 goes (the least recently used), not 0
    assert kept.get(1) is None and kept.get(0) == b"aaaa" and kept.bytes == 9
    kept.put(4, b"e" * 50)  # alone over the budget: the newest is kept, the rest dropped
    assert len(kept) == 1 and kept.get(4) == b"e" * 50 and kept.bytes == 50
    kept.drop(4)
    assert len(kept) == 0 and kept.bytes == 0


def test_small_files_past_the_bound_are_held_whole_within_their_byte_budget(tmp_path, monkeypatch):
    """Past ``max_open_files`` a small file is read whole and kept by its bytes, with no
    descriptor; the held bytes stay within their budget (least recently held dropped), a
    file over ``SMALL_FILE`` is still read through a descriptor, and a read past a held
    file's end is refused as truncated."""
    pool = _handles.HANDLES
    monkeypatch.setattr(_handles, "HELD_BYTES", 3 * (1000 + _handles._HELD_OVERHEAD))
    files = []
    for i in range(8):
        (tmp_path / f"{i}.bin").write_bytes(bytes([i]) * 1000)
        files.append(Blob(str(tmp_path / f"{i}.bin")))
    (tmp_path / "big.bin").write_bytes(b"b" * (_handles.SMALL_FILE + 1))
    big = Blob(str(tmp_path / "big.bin"))
    try:
        pool.ask(2)
        before = len(os.listdir("/proc/self/fd"))
        for _ in range(3):
            for i, blob in enumerate(files):
                assert blob.read(10, 20) == bytes([i]) * 10
                view = bytearray(5)
                blob.read_into([memoryview(view)], [995])
                assert view == bytes([i]) * 5
                assert len(pool) <= 2 and pool.held.bytes <= _handles.HELD_BYTES
        assert len(os.listdir("/proc/self/fd")) <= before + 2
        assert len(pool) == 1  # the other place is for reading a small file whole
        assert len(pool.held) == 3  # the budget holds three; the rest were dropped in turn
        held = len(pool.held)
        end = _handles.SMALL_FILE
        assert big.read(0, 4) == b"bbbb" and big.read(end, end + 99) == b"b"
        assert big.read(0, 1) == b"b" and len(pool.held) == held  # by descriptor, not held
        with pytest.raises(TruncatedError, match=r"7.bin ended early"):
            files[7].read_into([memoryview(bytearray(10))], [995])
    finally:
        pool.ask(_handles.DEFAULT_MAX_OPEN_FILES)


def test_plan_says_what_4096_hosts_ask_of_the_store(server, proxy, tmp_path):
    url = "s3://data/catalog-plan"
    _upload(server, _folder(tmp_path, 64), url)
    options = _options(server, proxy)
    proxy.reset()
    meshfeed.open_source(url, storage_options=options)
    one_host = proxy.counts()["total"]
    proxy.reset()
    out = subprocess.run(
        [sys.executable, "-m", "meshfeed", "plan", "--mesh", "data=8", "--spec", "data",
         "--data", url, "--endpoint-url", proxy.endpoint, "--processes", "4096",
         "--batch", "64"],
        capture_output=True, text=True, env={**os.environ, "AWS_ACCESS_KEY_ID": "test",
                                             "AWS_SECRET_ACCESS_KEY": "test"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert proxy.counts()["total"] >= one_host  # the plan opened it as a host does
    line = next(x for x in out.stdout.splitlines() if "start-up:" in x)
    assert f"start-up: {one_host:,} request(s) a process" in line
    assert f"{4096 * one_host:,} for the pod" in line
    plan = meshfeed.inspect.plan(
        meshfeed.batch_sharding(meshfeed.make_mesh(data=8)), data=url, processes=4096,
        global_batch_size=64, storage_options=options,
    )  # fmt: skip
    assert plan.pod is not None and plan.pod.pod_startup_requests == 4096 * one_host
    assert plan.pod.step_requests == 2.0  # a host's one row of a step, in 2 fields
