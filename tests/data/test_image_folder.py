"""``ImageFolderSource``: a folder of class subfolders read as torchvision reads it, listed
once and kept (one request to open on S3), or files and a label function."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import s3fs

import meshfeed
from image_fns import image_folder, torchvision_samples
from meshfeed.data._sources import Origins
from meshfeed.testing import CountingProxy

CATALOG = "meshfeed.images.json"


def test_classes_labels_and_order_are_torchvision_imagefolders(tmp_path):
    root = image_folder(tmp_path / "train")
    source = meshfeed.ImageFolderSource(root)
    classes, samples = torchvision_samples(str(root))
    assert source.classes == classes == ["Dog", "bird", "cat"]
    assert [source.path(i) for i in range(len(source))] == [path for path, _ in samples]
    ids = np.arange(len(source))
    got = source[ids]
    np.testing.assert_array_equal(got["label"], [label for _, label in samples])
    for i, (path, _) in enumerate(samples):
        with open(path, "rb") as f:
            assert got["image"][i].tobytes() == f.read()
    assert source.fields["image"] == meshfeed.sources.FieldSpec((None,), np.dtype(np.uint8))
    assert source[3]["label"] == samples[3][1]  # an int index: one example
    assert isinstance(source, Origins) and source.origin(3) == samples[3][0]  # for messages
    assert "18 images, 3 classes" in repr(source)


def test_the_listing_is_kept_beside_the_folder_and_read_after(tmp_path, capsys):
    root = image_folder(tmp_path / "train")
    first = meshfeed.ImageFolderSource(root)
    kept = json.loads((root / CATALOG).read_text())
    assert kept["paths"] == first.paths and kept["classes"] == first.classes
    (root / "bird" / "late.jpg").write_bytes((root / "stray.jpg").read_bytes())
    again = meshfeed.ImageFolderSource(root)  # read from the catalog: no listing
    assert len(again) == len(first) and again.fingerprint == first.fingerprint
    rebuilt = meshfeed.ImageFolderSource(root, rebuild_catalog=True)
    assert len(rebuilt) == len(first) + 1 and rebuilt.fingerprint != first.fingerprint
    unkept = meshfeed.ImageFolderSource(tmp_path / "train", catalog=False)
    assert len(unkept) == len(rebuilt)
    elsewhere = meshfeed.ImageFolderSource(root, catalog=tmp_path / "kept.json")
    assert (tmp_path / "kept.json").exists() and len(elsewhere) == len(rebuilt)
    (tmp_path / "blocked").write_text("a file where a folder would be")
    capsys.readouterr()
    unwritable = meshfeed.ImageFolderSource(root, catalog=tmp_path / "blocked" / "kept.json")
    assert "cannot keep the listing of" in capsys.readouterr().err  # listed at every open
    assert unwritable.paths == rebuilt.paths


def test_on_s3_a_host_opens_it_with_one_request(server, tmp_path):
    local = image_folder(tmp_path / "train")
    url = "s3://data/images/train"
    fs = s3fs.S3FileSystem(**server.storage_options)
    fs.put(str(local), url, recursive=True)
    fs.rm(f"{url}/{CATALOG}")
    built = meshfeed.ImageFolderSource(url, storage_options=server.storage_options)
    assert fs.exists(f"{url}/{CATALOG}")
    here = meshfeed.ImageFolderSource(local, catalog=False)
    assert built.paths == here.paths and built.classes == here.classes
    proxy = CountingProxy(server.port)
    try:
        options = {**server.storage_options, "endpoint_url": proxy.endpoint}
        proxy.reset()
        source = meshfeed.ImageFolderSource(url, storage_options=options)
        assert proxy.counts()["total"] == 1  # the catalog, whatever the file count
        proxy.reset()
        ids = np.array([0, 5, 17, 5])
        got, want = source[ids], here[ids]
        assert proxy.counts()["head"] == 0 and proxy.counts()["total"] == 4  # a GET a file
        np.testing.assert_array_equal(got["image"].values, want["image"].values)
        np.testing.assert_array_equal(got["label"], want["label"])
    finally:
        proxy.close()


def test_files_and_a_label_function_or_a_glob(tmp_path):
    root = image_folder(tmp_path / "train")
    pattern = str(root / "*" / "*.jpg")
    by_glob = meshfeed.ImageFolderSource(files=pattern, label=lambda p: len(os.path.basename(p)))
    assert by_glob.classes is None and len(by_glob) > 0
    assert all(p.endswith(".jpg") and "deeper" not in p for p in by_glob.paths)
    assert set(by_glob[np.arange(len(by_glob))]["label"]) == {len("img_000.jpg")}
    listed = [str(root / "bird" / "img_001.png"), str(root / "Dog" / "img_001.jpg")]
    unlabelled = meshfeed.ImageFolderSource(files=listed)
    assert list(unlabelled.fields) == ["image"] and unlabelled.paths == listed


def test_bad_input_is_refused_with_the_fix(tmp_path):
    root = image_folder(tmp_path / "train")
    with pytest.raises(ValueError, match=r"takes root= .* or files= .*not both and not neither"):
        meshfeed.ImageFolderSource()
    with pytest.raises(TypeError, match=r"label= is a function of a file's path .* for files="):
        meshfeed.ImageFolderSource(root, label=lambda p: 0)
    with pytest.raises(TypeError, match=r"label\(path\) must return an int; it returned 'x'"):
        meshfeed.ImageFolderSource(files=str(root / "cat" / "*.jpg"), label=lambda p: "x")  # type: ignore[arg-type]
    (root / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"the classes \['empty'\] with image files"):
        meshfeed.ImageFolderSource(root, rebuild_catalog=True)
    with pytest.raises(FileNotFoundError, match=r"no class subfolder with image files"):
        meshfeed.ImageFolderSource(tmp_path / "train" / "empty")
