"""``meshfeed.vision.shard_images`` and ``meshfeed shard``: an image folder written as shards.

The shards hold the folder's images -- each file's bytes, its label, its id -- and its
classes, in a keyed random order (or the folder's); the same bytes for worker processes
as for one process; a build stopped by a failing read is refused by ``open_source``,
and run again writes only the parts it had not; on S3 the shards are read in a few
requests where the folder takes one an image.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import meshfeed
from image_fns import image_folder
from meshfeed.vision import shard_images


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return image_folder(tmp_path_factory.mktemp("shard") / "train", per_class=8)


def _pairs(source) -> list[tuple[int, bytes]]:
    batch = source[np.arange(len(source))]
    images = batch["image"].to_list()
    return sorted(
        (int(label), bytes(image)) for label, image in zip(batch["label"], images, strict=True)
    )


def _files(out: Path) -> dict[str, str]:
    """Each shard file of a build and its SHA-256, from the build's catalog."""
    record = json.loads((out / "meshfeed.prepare.json").read_text())
    digests = {}
    for shard in record["catalog"]["shards"]:
        for field in shard["files"].values():
            for entry in field.values() if "values" in field else [field]:
                digests[entry["path"]] = entry["sha256"]
    return digests


def test_the_shards_hold_the_folders_images_labels_and_classes(folder, tmp_path):
    images = meshfeed.ImageFolderSource(folder)
    out = tmp_path / "shards"
    done = subprocess.run(
        [sys.executable, "-m", "meshfeed", "shard", str(folder), str(out), "--workers", "2",
         "--part-bytes", "40000", "--quiet"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "parts written (complete)" in done.stdout and "24 images" in done.stdout
    shards = meshfeed.open_source(out)
    assert shards.classes == images.classes == ["Dog", "bird", "cat"]
    assert len(shards) == len(images) == 24 and len(_files(out)) >= 3 * 3  # several parts
    assert _pairs(shards) == _pairs(images)
    got = shards[np.arange(len(shards))]
    for k, index in enumerate(got["index"]):  # each image's id names its file
        assert bytes(got["image"][k]) == Path(images.path(int(index))).read_bytes()
    order = got["index"].tolist()
    assert sorted(order) == list(range(24)) and order != sorted(order)  # a keyed order
    # One process writes the same files as two worker processes.
    alone = tmp_path / "alone"
    shard_images(folder, alone, part_bytes=40_000, workers=0, progress=False)
    assert _files(alone) == _files(out)
    # In the folder's order, on request; another seed is another order.
    listed = shard_images(folder, tmp_path / "listed", shuffle=False, workers=0,
                                   progress=False)  # fmt: skip
    assert listed.complete and listed.parts == 1
    in_order = meshfeed.open_source(tmp_path / "listed")
    assert in_order[np.arange(24)]["index"].tolist() == list(range(24))
    other = shard_images(folder, tmp_path / "seed1", seed=1, workers=0, progress=False)
    assert other.images == 24
    reordered = meshfeed.open_source(tmp_path / "seed1")[np.arange(24)]["index"].tolist()
    assert reordered != order and sorted(reordered) == list(range(24))


def test_a_flat_folder_with_a_labels_file(folder, tmp_path):
    files = sorted(str(p) for p in folder.rglob("*") if p.suffix.lower() in (".jpg", ".png"))
    labels = {path: i % 5 for i, path in enumerate(files)}
    flat = meshfeed.ImageFolderSource(files=files, label=labels.__getitem__)
    status = shard_images(flat, tmp_path / "val", workers=0, progress=False)
    shards = meshfeed.open_source(tmp_path / "val")
    assert status.images == len(flat) == len(files) and shards.classes is None
    assert _pairs(shards) == _pairs(flat)


def test_a_stopped_build_is_refused_and_run_again_writes_only_what_is_missing(folder, tmp_path):
    images = meshfeed.ImageFolderSource(folder)
    moved = Path(images.path(len(images) - 1))  # the last image: in the last part, in order
    kept = moved.read_bytes()
    moved.unlink()
    out = tmp_path / "shards"
    try:
        with pytest.raises(RuntimeError, match=rf"part \d+ of .*{moved.name}"):
            shard_images(images, out, part_bytes=40_000, shuffle=False, workers=0,
                                  progress=False)  # fmt: skip
    finally:
        moved.write_bytes(kept)
    with pytest.raises(FileNotFoundError, match=r"unfinished meshfeed shard build: parts \d+ of"):
        meshfeed.open_source(out)
    with pytest.raises(ValueError, match=r"another build than this one: seed=2 now, 0 when"):
        shard_images(images, out, part_bytes=40_000, shuffle=False, seed=2, workers=0)
    again = shard_images(images, out, part_bytes=40_000, shuffle=False, workers=0,
                                  progress=False)  # fmt: skip
    assert again.complete and again.ran == 1 and again.parts > 2
    assert _pairs(meshfeed.open_source(out)) == _pairs(images)
    with pytest.raises(ValueError, match=r"written by meshfeed shard, with no tokenizer"):
        meshfeed.open_source(out, tokenizer="tokenizer.json")


def test_on_s3_the_shards_take_a_few_requests_where_the_folder_takes_one_an_image(
    folder, server, tmp_path
):
    import s3fs

    options, where = server.storage_options, "s3://data/shard-images"  # its own prefix
    s3fs.S3FileSystem(**options).put(str(folder), f"{where}/train", recursive=True)
    remote = meshfeed.ImageFolderSource(f"{where}/train", storage_options=options)
    assert len(remote) == 24
    status = shard_images(remote, f"{where}/shards", part_bytes=100_000, workers=0,
                          storage_options=options, progress=False)  # fmt: skip
    assert status.complete and status.parts >= 2
    shards = meshfeed.open_source(f"{where}/shards", storage_options=options)
    assert shards.classes == remote.classes
    before = shards.requests
    assert _pairs(shards) == _pairs(remote)
    # Each part is one shard: its offsets and its values, a request or two each.
    assert shards.requests - before <= 4 * status.parts < len(remote)
