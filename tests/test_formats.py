"""Streaming formats read by index: WebDataset shards, JSON Lines and TFRecord files
written by other libraries read back exactly, every sample once per epoch, elastic
resume, object storage, and damaged files named."""

from __future__ import annotations

import gc
import gzip
import json
import os
import shutil
import tarfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import meshfeed
from formats_fns import (
    SAMPLES,
    payload,
    records,
    stream,
    streams,
    write_jsonl,
    write_tar_command,
    write_tfrecord,
    write_wds,
)
from meshfeed.testing import Proxy, run_in_processes
from multiprocess_fns import assemble

KEY = {"tar": "id", "jsonl": "id", "tfrecord": "label"}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("formats")
    out = {
        "tar": write_wds(folder / "wds"),
        "jsonl": write_jsonl(folder / "jsonl", "plain"),
        "tfrecord": write_tfrecord(folder / "tfrecord"),
    }
    for paths in out.values():
        meshfeed.index(paths, progress=False)
    return out


def test_webdataset_shards_read_as_webdataset_reads_them(files):
    from webdataset.compat import WebDataset

    ours = meshfeed.sources.TarSource(files["tar"])
    assert len(ours) == SAMPLES and set(ours.fields) == {"png", "cls", "id", "json", "__key__"}
    with warnings.catch_warnings():  # webdataset leaves its shard files for the collector
        warnings.simplefilter("ignore", ResourceWarning)
        theirs = list(WebDataset(files["tar"], shardshuffle=False))
        gc.collect()
    got = ours[np.arange(len(ours))]
    for i, sample in enumerate(theirs):
        assert got["__key__"][i] == sample["__key__"]
        for ext in ("png", "cls", "id", "json"):
            assert got[ext][i] == sample[ext], (i, ext)
    decoded = meshfeed.sources.TarSource(files["tar"], decode={"cls": "int", "json": "json"})
    rows = decoded[np.array([3, 77])]
    assert rows["cls"].tolist() == [3, 7] and rows["json"][1] == {"i": 77, "even": False}


def test_a_shard_made_by_gnu_tar_with_long_names(tmp_path):
    shard = write_tar_command(tmp_path)
    source = meshfeed.sources.TarSource(shard, decode={"id": "int"}, build=True)
    with tarfile.open(shard) as archive:
        members = {}
        for member in archive.getmembers():
            data = archive.extractfile(member)
            if data is not None:
                members[member.name] = data.read()
    got = source[np.arange(len(source))]
    assert len(source) == 30 and got["id"].tolist() == list(range(30))
    for i, key in enumerate(got["__key__"]):
        assert got["txt"][i] == members[f"{key}.txt"] == payload(i)
    assert got["__key__"][7].startswith("deep/deep/")


@pytest.mark.parametrize("kind", ["plain", "gz", "zst"])
def test_json_lines_plain_or_in_members(tmp_path, kind):
    paths = write_jsonl(tmp_path, kind)
    meshfeed.index(paths, progress=False)
    source = meshfeed.sources.JsonlSource(paths)
    assert source.fields["tokens"].ragged and source.fields["text"].dtype == object
    order = [r for k in range(3) for r in records()[k::3]]  # file after file
    got = source[np.arange(len(source))]
    assert got["id"].tolist() == [r["id"] for r in order]
    assert got["text"].tolist() == [r["text"] for r in order]
    assert [t.tolist() for t in got["tokens"].to_list()] == [r["tokens"] for r in order]


def test_one_large_compressed_member_is_refused_then_rewritten_seekable(tmp_path):
    rows = [json.dumps({"id": i, "text": "y" * 300}) + "\n" for i in range(60_000)]
    path = tmp_path / "big.jsonl.gz"
    path.write_bytes(gzip.compress("".join(rows).encode()))
    with pytest.raises(
        ValueError, match=r"big.jsonl.gz holds a gzip member of 19 MiB .* meshfeed index --seekable"
    ):
        meshfeed.index(str(path), progress=False)
    meshfeed.index(str(path), seekable=True, progress=False)
    assert gzip.decompress(path.read_bytes()) == "".join(rows).encode()  # the same text
    source = meshfeed.sources.JsonlSource(str(path), fields=["id"])
    assert source[np.array([0, 59_999, 31_337])]["id"].tolist() == [0, 59_999, 31_337]


def test_tfrecord_files_read_as_the_tfrecord_package_reads_them(files):
    from tfrecord.reader import tfrecord_loader

    inferred = meshfeed.sources.TFRecordSource(files["tfrecord"], decode="example")  # from record 0
    assert set(inferred.fields) == {"image", "label", "vec"} and not inferred.fields["vec"].ragged
    with pytest.raises(
        ValueError,
        match=r"record 1 of .*: feature 'vec' holds 3 values, not one; type it 'ragged:float32'",
    ):
        inferred[np.arange(len(inferred))]
    features = {"image": "bytes", "label": "int64", "vec": "ragged:float32"}
    ours = meshfeed.sources.TFRecordSource(files["tfrecord"], decode="example", features=features)
    got = ours[np.arange(len(ours))]
    theirs: list[Any] = [r for p in files["tfrecord"] for r in tfrecord_loader(p, None)]
    for i, record in enumerate(theirs):
        assert got["image"][i] == record["image"]
        assert got["label"][i] == record["label"][0]
        np.testing.assert_array_equal(got["vec"].to_list()[i], record["vec"])
    raw = meshfeed.sources.TFRecordSource(files["tfrecord"])
    assert meshfeed.sources.parse_example(raw[np.array([4])]["record"][0])["label"].tolist() == [8]


def _ids(batches: list[dict[str, np.ndarray]], key: str) -> list[int]:
    return [int(i) for b in batches for i in b[key][b["mask"]]]


@pytest.mark.multiprocess
def test_every_sample_once_per_epoch_and_a_two_process_state_resumes_on_one_and_four(files):
    kinds = ["tar", "jsonl", "tfrecord"]  # each format in the same processes, one after another
    two = run_in_processes(
        streams, {k: (files[k], None) for k in kinds}, 4, num_processes=2, devices_per_process=4
    )
    states = {k: two[0][k]["state"] for k in kinds}
    four = run_in_processes(
        streams, {k: (files[k], states[k]) for k in kinds}, num_processes=4, devices_per_process=2
    )
    for kind in kinds:
        key = KEY[kind]
        one = assemble([stream(kind, files[kind])])
        assert sorted(_ids(one, key)) == list(range(SAMPLES)), kind
        assert all(r[kind]["state"] == states[kind] for r in two), kind
        want = assemble([r[kind] for r in two])
        assert _ids(one, key)[4 * 8 :] == _ids(want, key), kind  # one order on 1 and 2
        on_one = assemble([stream(kind, files[kind], states[kind])])
        for got in (on_one, assemble([r[kind] for r in four])):
            assert len(got) == len(want), kind
            for g, w in zip(got, want, strict=True):
                for name in w:
                    np.testing.assert_array_equal(g[name], w[name], err_msg=kind)
        if kind == "tar":
            sizes = {
                int(i): int(s)
                for b in one
                for i, s in zip(b["id"][b["mask"]], b["size"][b["mask"]], strict=True)
            }
            assert sizes == {i: len(payload(i)) for i in range(SAMPLES)}


def test_formats_pack_mix_and_block_shuffle(files):
    docs = meshfeed.sources.JsonlSource(files["jsonl"], fields={"tokens": "ragged:int32"})
    packed = meshfeed.pack(docs, 16)
    assert packed.stats()["tokens"] == sum(len(r["tokens"]) for r in records())
    halves = [meshfeed.sources.JsonlSource(files["jsonl"][:2], fields={"id": "int64"}),
              meshfeed.sources.JsonlSource(files["jsonl"][2:], fields={"id": "int64"})]  # fmt: skip
    both = meshfeed.mix(halves, weights=[0.5, 0.5])
    seen = set(both[np.arange(len(both))]["id"].tolist())
    assert seen == set(range(SAMPLES))
    blocks = assemble([stream("tfrecord", files["tfrecord"], shuffle_block=8)])
    assert sorted(_ids(blocks, "label")) == list(range(SAMPLES))


def test_a_file_changed_after_indexing_is_refused_by_name(tmp_path):
    (path,) = write_jsonl(tmp_path, "plain", files=1)
    meshfeed.index(path, progress=False)
    meshfeed.sources.JsonlSource(path)
    time.sleep(0.01)
    with open(path, "a") as f:
        f.write(json.dumps({"id": 1000, "text": "", "tokens": [1], "score": 0.0}) + "\n")
    with pytest.raises(
        ValueError, match=r"part-0.jsonl changed since it was indexed \(its size is"
    ):
        meshfeed.sources.JsonlSource(path)
    report = meshfeed.index(path, progress=False)  # indexing again accepts it
    assert report.indexed == [path] and len(meshfeed.sources.JsonlSource(path)) == SAMPLES + 1


def test_a_missing_index_says_how_to_build_it_and_index_dir_keeps_them_elsewhere(tmp_path):
    (path,) = write_tfrecord(tmp_path, files=1)
    with pytest.raises(
        FileNotFoundError, match=r"has no index yet; build the indexes once with meshfeed.index"
    ):
        meshfeed.sources.TFRecordSource(path)
    os.chmod(tmp_path, 0o555)  # the data's folder read-only: indexes go elsewhere
    try:
        report = meshfeed.index(path, index_dir=tmp_path.parent / "indexes", progress=False)
    finally:
        os.chmod(tmp_path, 0o755)
    assert report.samples == SAMPLES
    source = meshfeed.sources.TFRecordSource(path, index_dir=tmp_path.parent / "indexes")
    assert len(source) == SAMPLES
    again = meshfeed.index(path, index_dir=tmp_path.parent / "indexes", progress=False)
    assert again.indexed == [] and again.current == [path]  # resumable per file


def test_damaged_files_are_named_with_file_and_offset(tmp_path, files):
    shard = tmp_path / "cut.tar"
    shard.write_bytes(Path(files["tar"][0]).read_bytes()[:5000])
    with pytest.raises(
        ValueError,
        match=r"cut.tar: truncated: it stops after member 's00000.id' at byte 5000 of 5000",
    ):
        meshfeed.index(str(shard), progress=False)
    record = tmp_path / "bad.tfrecord"
    data = bytearray(Path(files["tfrecord"][0]).read_bytes())
    data[40] ^= 0xFF  # a byte of the first record's data
    record.write_bytes(bytes(data))
    meshfeed.index(str(record), progress=False)
    with pytest.raises(
        ValueError, match=r"bad.tfrecord: the record at byte 0 does not match its CRC"
    ):
        meshfeed.sources.TFRecordSource(str(record))[np.array([0])]
    lines = tmp_path / "bad.jsonl"
    lines.write_text('{"id": 0}\n{"id": 1\n{"id": 2}\n')
    meshfeed.index(str(lines), progress=False)
    source = meshfeed.sources.JsonlSource(str(lines), fields={"id": "int64"})
    with pytest.raises(ValueError, match=r"bad.jsonl, the record at byte 10: not JSON"):
        source[np.array([1])]
    with pytest.raises(ValueError, match=r"notes.txt: meshfeed.index reads .tar"):
        (tmp_path / "notes.txt").write_text("x")
        meshfeed.index(str(tmp_path / "notes.txt"))


def test_a_sample_missing_an_extension_is_refused_or_marked(tmp_path):
    from webdataset.writer import TarWriter

    with TarWriter(str(tmp_path / "gaps.tar")) as sink:
        for i in range(6):
            sample = {"__key__": f"k{i}", "id": str(i)}
            if i != 4:
                sample["txt"] = f"text {i}"
            sink.write(sample)
    with pytest.raises(
        ValueError, match=r"gaps.tar: sample 'k4' has no 'txt' member .* missing='mark'"
    ):
        meshfeed.sources.TarSource(str(tmp_path / "gaps.tar"), build=True)
    marked = meshfeed.sources.TarSource(
        str(tmp_path / "gaps.tar"), missing="mark", decode={"txt": "text"}
    )
    rows = marked[np.arange(6)]
    assert rows["txt_missing"].tolist() == [False] * 4 + [True, False]
    assert rows["txt"][5] == "text 5" and rows["txt"][4] is None


@pytest.mark.multiprocess
def test_from_the_s3_server_through_an_outage(files, server, tmp_path):
    import fsspec

    opts = server.storage_options
    fs = fsspec.filesystem("s3", **opts)
    urls = []
    for p in files["tar"]:
        fs.put(p, f"data/wds/{os.path.basename(p)}")
        urls.append(f"s3://data/wds/{os.path.basename(p)}")
    report = meshfeed.index(
        "s3://data/wds/shard-{000..003}.tar", storage_options=opts, progress=False
    )
    assert report.samples == SAMPLES and fs.exists("data/wds/shard-000.tar.meshfeed-index.npz")
    local = assemble([stream("tar", files["tar"])])
    two = assemble(run_in_processes(stream, "tar", urls, None, 0, opts, num_processes=2))
    for g, w in zip(two, local, strict=True):
        np.testing.assert_array_equal(g["id"], w["id"])
    proxy = Proxy(server.port)
    flaky = {**opts, "endpoint_url": proxy.endpoint}
    source = meshfeed.sources.TarSource(urls, decode={"id": "int"}, storage_options=flaky)
    first = source[np.arange(0, 10)]["id"].tolist()
    proxy.stop()
    start_back = time.monotonic()
    import threading

    threading.Timer(3.0, proxy.start).start()
    rest = source[np.arange(10, SAMPLES)]["id"].tolist()
    assert time.monotonic() - start_back >= 2.5  # it waited for the store, then went on
    assert first + rest == list(range(SAMPLES))
    proxy.stop()
    shutil.rmtree(tmp_path, ignore_errors=True)
