"""meshfeed's own layout: write_source / open_source, locally, through fsspec, and on
2 processes; every damaged file refused with its name."""

from __future__ import annotations

import json
import os
import re
import uuid

import fsspec
import numpy as np
import pytest

import meshfeed
from meshfeed.testing import run_in_processes
from source_fns import N, original, round_trip


def _written(tmp_path, shard_size=40):
    path = tmp_path / "data"
    meshfeed.write_source(path, original(), shard_size=shard_size)
    return path


def test_round_trip_over_several_shards(tmp_path):
    path = _written(tmp_path)
    assert sorted(os.listdir(path / "image")) == ["00000.npy", "00001.npy", "00002.npy"]
    source = meshfeed.open_source(path)
    assert len(source) == N
    assert source.fields["image"] == meshfeed.sources.FieldSpec((4, 4), np.dtype(np.uint8))
    ids = np.array([95, 0, 41, 39, 40, 41, 7])  # across shard edges, repeated, unsorted
    got = source[ids]
    for name, array in original().items():
        np.testing.assert_array_equal(got[name], array[ids])


def test_records_are_written_a_shard_at_a_time(tmp_path):
    data = original()
    records = ({k: v[i] for k, v in data.items()} for i in range(N))
    manifest = meshfeed.write_source(tmp_path / "r", records, shard_size=50)
    assert [s["rows"] for s in manifest["shards"]] == [50, 46]
    source = meshfeed.open_source(tmp_path / "r")
    np.testing.assert_array_equal(source[np.arange(N)]["tokens"], data["tokens"])


def test_reads_only_the_rows_asked_for(tmp_path):
    source = meshfeed.open_source(_written(tmp_path))
    row_bytes = 16 + 6 * 4 + 8
    source[np.array([3, 4, 5, 60])]
    assert source.bytes_read == 4 * row_bytes


def test_a_run_of_consecutive_rows_is_one_read_of_just_those_rows(tmp_path):
    source = meshfeed.open_source(_written(tmp_path))  # shards of 50: 45..54 spans two
    for ids in (np.arange(45, 55), np.arange(10, 11), np.arange(20, 22)):
        before = source.bytes_read
        got = source[ids]
        for name, array in original().items():
            np.testing.assert_array_equal(got[name], array[ids])
        assert source.bytes_read - before == len(ids) * (16 + 6 * 4 + 8)
    nearly = np.array([3, 4, 6])  # not a run: the general path, the same rows
    np.testing.assert_array_equal(source[nearly]["tokens"], original()["tokens"][nearly])


@pytest.mark.parametrize("scheme", ["file", "memory"])
def test_fsspec_urls_work_like_paths(tmp_path, scheme):
    if scheme == "file":
        url = f"file://{tmp_path}/data"
    else:
        url = f"memory://meshfeed-test-{uuid.uuid4().hex}/data"
    meshfeed.write_source(url, original(), shard_size=40)
    by_url = meshfeed.open_source(url)
    ids = np.array([90, 2, 3, 4, 50])
    got = by_url[ids]
    for name, array in original().items():
        np.testing.assert_array_equal(got[name], array[ids])
    assert by_url.bytes_read == 5 * (16 + 6 * 4 + 8)  # those rows, nothing else


def test_single_npy_and_stored_npz(tmp_path):
    data = original()
    np.save(tmp_path / "tokens.npy", data["tokens"])
    npy = meshfeed.open_source(tmp_path / "tokens.npy")
    assert list(npy.fields) == ["tokens"]
    np.testing.assert_array_equal(npy[np.array([5, 1])]["tokens"], data["tokens"][[5, 1]])
    np.savez(tmp_path / "all.npz", **data)  # type: ignore[arg-type]
    npz = meshfeed.open_source(tmp_path / "all.npz")
    np.testing.assert_array_equal(npz[np.array([9, 8])]["image"], data["image"][[9, 8]])


def test_compressed_npz_is_refused(tmp_path):
    np.savez_compressed(tmp_path / "c.npz", x=np.zeros((4, 2)))
    with pytest.raises(ValueError, match=r"c.npz member 'x.npy' is compressed"):
        meshfeed.open_source(tmp_path / "c.npz")


def test_truncated_shard_names_the_file_at_its_first_read(tmp_path):
    path = _written(tmp_path)
    shard = path / "tokens" / "00001.npy"
    shard.write_bytes(shard.read_bytes()[:-10])
    source = meshfeed.open_source(path)  # the catalog only: nothing of the shards is read
    source[np.array([0, 95])]  # shards 0 and 2 read as they are
    with pytest.raises(ValueError, match=r"tokens/00001.npy is \d+ bytes, its catalog says"):
        source[np.array([41])]


def test_corrupt_header_names_the_file_at_its_first_read(tmp_path):
    path = _written(tmp_path)
    shard = path / "image" / "00002.npy"
    shard.write_bytes(b"garbage!" + shard.read_bytes()[8:])
    source = meshfeed.open_source(path)
    with pytest.raises(ValueError, match=r"image/00002.npy is not a .npy array"):
        source[np.array([90])]


def test_checksum_mismatch_names_the_file(tmp_path):
    path = _written(tmp_path)
    shard = path / "label" / "00000.npy"
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 0xFF  # same size, one byte flipped
    shard.write_bytes(bytes(raw))
    meshfeed.open_source(path)  # sizes and headers still agree
    with pytest.raises(ValueError, match=r"label/00000.npy does not match its checksum"):
        meshfeed.open_source(path, verify=True)


def test_shards_with_different_dtypes_name_the_file(tmp_path):
    path = _written(tmp_path)
    shard = path / "label" / "00001.npy"
    np.save(shard, np.load(shard).astype(np.int32))
    manifest = json.loads((path / "meshfeed.json").read_text())
    manifest["shards"][1]["files"]["label"]["bytes"] = shard.stat().st_size
    (path / "meshfeed.json").write_text(json.dumps(manifest))
    source = meshfeed.open_source(path)
    with pytest.raises(
        ValueError, match=r"label/00001.npy holds \(40,\) int32, its catalog says \(40,\) int64"
    ):
        source[np.array([45])]


def test_unfinished_write_and_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"meshfeed\.json does not exist"):
        meshfeed.open_source(tmp_path)
    _written(tmp_path)
    with pytest.raises(FileExistsError, match="already holds a dataset"):
        meshfeed.write_source(tmp_path / "data", original())
    with pytest.raises(ValueError, match="different lengths"):
        meshfeed.write_source(tmp_path / "x", {"a": np.zeros(3), "b": np.zeros(4)})
    with pytest.raises(ValueError, match="record 1 has fields"):
        meshfeed.write_source(tmp_path / "y", [{"a": np.zeros(2)}, {"a": np.zeros(3)}])
    with pytest.raises(ValueError, match="shard_size=0 must be an int >= 1"):
        meshfeed.write_source(tmp_path / "z", original(), shard_size=0)
    with pytest.raises(ValueError, match="holds Python objects"):
        meshfeed.write_source(tmp_path / "o", {"a": np.array([b"x", b"yy"], dtype=object)})


def test_loads_on_two_processes_reading_only_their_rows(tmp_path):
    path = _written(tmp_path)
    results = run_in_processes(
        round_trip, "store", str(path), num_processes=2, devices_per_process=4
    )
    for result in results:
        assert result["mismatches"] == 0
        assert result["asked"] == result["needed"]
    assert not set(results[0]["asked"]) & set(results[1]["asked"])
    assert sorted(results[0]["asked"] + results[1]["asked"]) == list(range(N))


FILES = {
    "x.parquet": r"a Parquet file, .*: open it with meshfeed\.sources\.ParquetSource\('{}'\)\.$",
    "x.tar": r"a WebDataset tar file, .*TarSource\('{}'\) \(indexed once first: meshfeed index "
    r"{}\)",
    "x.tgz": r"a WebDataset tar file, .*: open it with meshfeed\.sources\.TarSource\('{}'\)",
    "x.tar.gz": r"a WebDataset tar file, .*: open it with meshfeed\.sources\.TarSource\('{}'\)",
    "x.jsonl": r"a JSON Lines file, .*: open it with meshfeed\.sources\.JsonlSource\('{}'\)",
    "x.jsonl.gz": r"a JSON Lines file, .*: open it with meshfeed\.sources\.JsonlSource\('{}'\)",
    "x.jsonl.zst": r"a JSON Lines file, .*: open it with meshfeed\.sources\.JsonlSource\('{}'\)",
    "x.json": r"a JSON file, .*: if it holds JSON Lines \(an object per line\), name it \.jsonl "
    r"and open it with meshfeed\.sources\.JsonlSource\('{}l'\)",
    "x.tfrecord": r"a TFRecord file, .*: open it with meshfeed\.sources\.TFRecordSource\('{}'\)",
    "x.tfrecord.gz": r"a TFRecord file, .*: open it with meshfeed\.sources\.TFRecordSource",
    "x.array_record-00000-of-00002": r"an ArrayRecord file, .*ArrayRecordSource\('{}'\)\.$",
    "x.JPG": r"an image file, .*: open it with meshfeed\.ImageFolderSource\(files='{}'\)\.$",
}


@pytest.mark.parametrize("where", ["local", "url"])
@pytest.mark.parametrize("name", list(FILES))
def test_open_source_on_a_file_names_the_source_that_reads_it(tmp_path, where, name):
    if where == "local":
        path = str(tmp_path / name)
        (tmp_path / name).write_bytes(b"data")
    else:
        path = f"memory://meshfeed-test-{uuid.uuid4().hex}/{name}"
        with fsspec.open(path, "wb") as f:
            f.write(b"data")
    message = f"{re.escape(path)} is {FILES[name].format(*[re.escape(path)] * 2)}"
    with pytest.raises(ValueError, match=message):
        meshfeed.open_source(path)


def test_open_source_on_a_folder_of_other_files_names_their_source_with_a_glob(tmp_path):
    for i in range(3):
        (tmp_path / f"part-{i}.parquet").write_bytes(b"data")
    with pytest.raises(
        ValueError,
        match=rf"{re.escape(str(tmp_path))} has no meshfeed.json, so it is not a meshfeed folder, "
        rf"but it holds 3 Parquet files: open them with meshfeed\.sources\.ParquetSource\("
        rf"'{re.escape(str(tmp_path))}/\*\.parquet'\)\.$",
    ):
        meshfeed.open_source(tmp_path)
    url = f"memory://meshfeed-test-{uuid.uuid4().hex}/wds"
    for name in ("a.tar", "b.tar", "a.tar.meshfeed-index.npz", "meshfeed.catalog.json"):
        with fsspec.open(f"{url}/{name}", "wb") as f:
            f.write(b"data")
    with pytest.raises(
        ValueError,
        match=rf"holds 2 WebDataset tar files: open them with meshfeed\.sources\.TarSource\("
        rf"'{url}/\*\.tar'\) \(indexed once first: meshfeed index '{url}/\*\.tar'\)\.$",
    ):
        meshfeed.open_source(url)


def test_a_corrupt_manifest_or_header_names_its_file(tmp_path):
    path = _written(tmp_path)
    manifest = path / "meshfeed.json"
    text = manifest.read_text()
    manifest.write_text(text[: len(text) // 2])  # cut short
    with pytest.raises(ValueError, match=r"data/meshfeed.json: JSONDecodeError") as caught:
        meshfeed.open_source(path)
    assert isinstance(caught.value, meshfeed.sources.BadFileError)
    assert isinstance(caught.value.__cause__, json.JSONDecodeError)
    entries = json.loads(text)
    del entries["shards"][1]["files"]["image"]["path"]
    manifest.write_text(json.dumps(entries))
    with pytest.raises(ValueError, match=r"data/meshfeed.json, its shard 1: KeyError: 'path'"):
        meshfeed.open_source(path)
    manifest.write_text(text)
    shard = path / "image" / "00001.npy"
    head = bytearray(shard.read_bytes())
    head[head.index(b"}")] = ord("(")  # unclosed: numpy's parser raises tokenize's TokenError
    shard.write_bytes(bytes(head))
    source = meshfeed.open_source(path)
    with pytest.raises(ValueError, match=r"image/00001.npy has a corrupt .npy header \(\("):
        source[np.array([41])]
