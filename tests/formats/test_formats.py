"""Streaming formats read by index: WebDataset shards, JSON Lines and TFRecord files
written by other libraries read back exactly, every sample once per epoch, elastic
resume, object storage, and damaged files named."""

from __future__ import annotations

import gc
import gzip
import io
import json
import os
import re
import shutil
import tarfile
import time
import warnings
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

import meshfeed
from formats_fns import (
    BIG,
    SAMPLES,
    big,
    payload,
    read_as_peers_do,
    records,
    sized,
    stream,
    streams,
    write_compressed,
    write_jsonl,
    write_tar_command,
    write_tfrecord,
    write_tfrecord_gz,
    write_wds,
)
from formats_fns import (
    source as make_source,
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
        match=r"part-0.tfrecord, the record at byte \d+: feature 'vec' holds 3 values, not one; "
        r"type it 'ragged:float32'",
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


@pytest.mark.parametrize("writer", ["tarfile", "webdataset", "zstd"])
def test_a_compressed_shard_is_refused_then_made_seekable_and_read_as_webdataset_reads_it(
    tmp_path, writer
):
    path = write_compressed(tmp_path, writer)  # one member of 17 MiB, as each tool writes it
    name, kind = os.path.basename(path), "zstd" if writer == "zstd" else "gzip"
    theirs = read_as_peers_do(path)
    with pytest.raises(
        ValueError,
        match=rf"{name} holds a {kind} member of 17 MiB decompressed: reading one sample would "
        rf"decompress all of it.* meshfeed index --seekable \S*{name}$",
    ):
        meshfeed.index(path, progress=False)
    meshfeed.index(path, seekable=True, progress=False)
    assert read_as_peers_do(path) == theirs  # rewritten: the same samples for its peers
    source = meshfeed.sources.TarSource(path, decode={"cls": "int"})
    got = source[np.arange(len(source))]
    assert got["__key__"].tolist() == list(theirs)
    for i, (key, sample) in enumerate(theirs.items()):
        assert got["bin"][i] == sample["bin"] == big(i) and got["cls"][i] == i % 10, key
    arrays = source.files.index(0).arrays
    segments, starts = arrays["members"], arrays["offsets"][:, 0]  # "bin", the first column
    first, last = (np.searchsorted(segments[:, 2], x, "right") - 1 for x in (starts, starts + BIG))
    assert len(segments) == 18 and (first != last).sum() > 10  # samples straddling two
    requests, fetched = source.fetches(np.array([3]))  # the segments holding sample 3 alone
    assert requests == 1 and fetched < os.path.getsize(path) / 4


def test_a_damaged_segment_of_a_seekable_tgz_skips_the_samples_it_holds(tmp_path):
    path = write_compressed(tmp_path, "webdataset", n=8)  # 4 MiB: rewritten, 4 segments
    meshfeed.index(path, seekable=True, progress=False)
    source = meshfeed.sources.TarSource(path, decode={"cls": "int"}, key=None)
    arrays = source.files.index(0).arrays
    segment = arrays["members"][1]  # its compressed bytes damaged, its size and time kept
    stat, data = os.stat(path), bytearray(Path(path).read_bytes())
    data[int(segment[0]) + 50] ^= 0xFF
    Path(path).write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    starts, ends = arrays["offsets"].min(1), (arrays["offsets"] + arrays["sizes"]).max(1)
    held = np.flatnonzero((starts < segment[3]) & (ends > segment[2])).tolist()
    with pytest.raises(ValueError, match=rf"shard.tgz: the gzip data at byte {segment[0]} "):
        source[np.array(held[:1])]
    feed = meshfeed.Loader(
        source, global_batch_size=4, seed=3, on_error="skip", max_skipped=4,
        record_transform=sized, num_workers=2,
        sharding=meshfeed.batch_sharding(meshfeed.make_mesh(data=4, devices=jax.devices()[:4])),
    )  # fmt: skip
    batches = [{k: np.asarray(v) for k, v in b.items()} for b in feed]
    feed.close()
    sizes = np.concatenate([b["size"][b["mask"]] for b in batches])
    assert sorted(s.example for s in feed.skipped) == held and len(sizes) == 8 - len(held)
    assert (sizes == BIG).all() and all(path in s.error for s in feed.skipped)


def test_a_tfrecord_gz_as_tensorflow_writes_it_made_seekable(tmp_path):
    from tfrecord.reader import tfrecord_loader

    path = write_tfrecord_gz(tmp_path)  # one gzip member of 3 MB
    theirs = list(tfrecord_loader(path, None, compression_type="gzip"))
    meshfeed.index(path, seekable=True, progress=False)  # rewritten: restart points
    again = list(tfrecord_loader(path, None, compression_type="gzip"))  # still read by any tool
    assert [r["label"][0] for r in again] == [r["label"][0] for r in theirs] == list(range(30))
    features = {"image": "bytes", "label": "int64"}
    source = meshfeed.sources.TFRecordSource(path, decode="example", features=features)
    assert len(source.files.index(0).arrays["members"]) == 3
    got = source[np.arange(len(source))]
    for i, record in enumerate(theirs):
        assert got["image"][i] == record["image"] and got["label"][i] == record["label"][0]


def test_a_cut_or_corrupt_compressed_file_is_named(tmp_path):
    path = tmp_path / "cut.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for i in range(20):
            info = tarfile.TarInfo(f"k{i}.txt")
            info.size = 300
            archive.addfile(info, io.BytesIO(payload(i)[:20] * 15))
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match=r"cut.tar.gz: truncated \(the gzip stream ends inside"):
        meshfeed.index(str(path), progress=False)
    path.write_bytes(b"not gzip at all" + whole)
    with pytest.raises(ValueError, match=r"cut.tar.gz: not a gzip stream, or corrupt"):
        meshfeed.sources.TarSource(str(path), build=True)


def test_a_pax_header_with_a_bad_record_is_named_not_walked_forever(tmp_path):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        info = tarfile.TarInfo("k0." + "x" * 120)  # a long name: a pax "path" record
        info.size = 3
        archive.addfile(info, io.BytesIO(b"abc"))
    data = buffer.getvalue()
    at = data.index(b" path=")
    start = data.rfind(b"\n", 512, at) + 1 or 512  # the record's length: its digits
    shard = tmp_path / "pax.tar"
    shard.write_bytes(data[:start] + b"0" * (at - start) + data[at:])  # a length of 0
    with pytest.raises(ValueError, match=r"pax.tar: the pax header at byte 0 is corrupt"):
        meshfeed.index(str(shard), progress=False)
    header = bytearray(data[:512])  # its size: 2 MiB, in a file of 3 (not read into memory)
    header[124:136], header[148:156] = b"%011o\0" % (2 << 20), b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    shard.write_bytes(bytes(header) + data[512:] + bytes(3 << 20))
    with pytest.raises(
        ValueError, match=r"pax.tar: the tar header at byte 0 is corrupt \(an extended header of"
    ):
        meshfeed.index(str(shard), progress=False)


def test_a_member_that_does_not_decode_names_shard_sample_and_member(tmp_path, files):
    shard = tmp_path / "bad-json.tar"
    data = bytearray(Path(files["tar"][0]).read_bytes())
    data[data.index(b'{"i": 5,')] = ord("x")  # sample 5's json member: not JSON
    shard.write_bytes(bytes(data))
    source = meshfeed.sources.TarSource(str(shard), decode={"json": "json"}, build=True)
    with pytest.raises(
        ValueError, match=r"bad-json.tar, sample 's00005', its 'json' member: JSONDecodeError"
    ) as caught:
        source[np.array([4, 5])]
    assert isinstance(caught.value, meshfeed.sources.BadFileError)
    assert isinstance(caught.value.__cause__, json.JSONDecodeError)


def test_a_tfrecord_that_does_not_parse_or_holds_another_type_is_named(tmp_path):
    (path,) = write_tfrecord(tmp_path, n=4, files=1)
    data = bytearray(Path(path).read_bytes())
    data[12] = 0x0F  # record 0's first field: of wire type 7, which Example does not use
    Path(path).write_bytes(bytes(data))
    meshfeed.index(path, progress=False)
    source = meshfeed.sources.TFRecordSource(path, decode="example", check_crc=False,
                                             features={"label": "int64"})  # fmt: skip
    with pytest.raises(
        ValueError, match=r"part-0.tfrecord, the record at byte 0: ValueError: .* wire type 7"
    ) as caught:
        source[np.array([0])]
    assert isinstance(caught.value, meshfeed.sources.BadFileError)
    typed = meshfeed.sources.TFRecordSource(
        path, decode="example", features={"image": "int64"}, check_crc=False
    )
    with pytest.raises(
        ValueError,
        match=r"part-0.tfrecord, the record at byte \d+: feature 'image' holds bytes values, "
        r"but features= types it 'int64'",
    ):
        typed[np.array([1])]


def test_every_format_says_where_an_example_is_and_a_record_transforms_error_says_it(files):
    byte0 = "the record at byte 0"
    places = {"tar": r"sample '\w+'", "jsonl": byte0, "tfrecord": byte0}
    mesh = meshfeed.make_mesh(data=2, devices=jax.devices()[:2])

    def fails(record, rng):
        raise ValueError("cannot use this one")

    for kind, paths in files.items():
        source = make_source(kind, paths)
        origins = source
        assert isinstance(origins, meshfeed.sources.Origins)
        assert re.fullmatch(rf"{re.escape(paths[0])}, {places[kind]}", origins.origin(0)), kind
        loader = meshfeed.Loader(
            source, global_batch_size=2, shuffle=False, prefetch=0,
            sharding=meshfeed.batch_sharding(mesh), record_transform=fails,
        )  # fmt: skip
        where = re.escape(origins.origin(0))
        with pytest.raises(RuntimeError, match=rf"raised on example 0 \({where}\)"):
            next(iter(loader))
