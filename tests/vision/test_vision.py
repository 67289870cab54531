"""``meshfeed.vision``: torchvision's training and eval crops as record work, the same
bytes for any workers and after a resume on another device count; nvImageCodec's decode
of a whole step (its CPU codecs) cuts the same crops and gives the same pixels. A JPEG
cut short is named by its id and its file, or skipped alone, whatever decodes it and
wherever."""

from __future__ import annotations

import io
import re

import jax
import numpy as np
import pytest
from PIL import Image

import meshfeed
import meshfeed.vision as vision
from image_fns import encode, folder_with_a_truncated_jpeg, image, image_folder

SIZE = 32


def _batches(loader: meshfeed.Loader) -> list[dict[str, np.ndarray]]:
    out = [{k: np.asarray(v) for k, v in batch.items()} for batch in loader]
    loader.close()
    return out


def _loader(source, devices=8, **options) -> meshfeed.Loader:
    mesh = meshfeed.make_mesh(data=devices, devices=jax.devices()[:devices])
    return meshfeed.Loader(source, global_batch_size=8, sharding=meshfeed.batch_sharding(mesh),
                           seed=3, **options)  # fmt: skip


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return image_folder(tmp_path_factory.mktemp("images") / "train")


def test_a_crop_follows_torchvisions_rule():
    rng = np.random.default_rng(0)
    for _ in range(500):
        height, width = (int(v) for v in rng.integers(20, 400, 2))
        top, left, h, w = vision.random_resized_crop(height, width, rng)
        assert 0 <= top <= height - h and 0 <= left <= width - w and h > 0 and w > 0
    # Ten misses (no crop of this area fits a 10 x 1000 strip): the centre, at the ratio's edge.
    assert vision.random_resized_crop(10, 1000, rng, scale=(0.9, 1.0)) == (0, 493, 10, 13)
    assert vision.resize_shorter(375, 500, 256) == (256, 341)  # the longer side truncated
    assert vision.center_crop(256, 341, 224) == (16, 58, 224, 224)  # 58.5 rounds to even


def test_the_train_crop_is_pillows_crop_then_resize_then_flip(folder):
    source = meshfeed.ImageFolderSource(folder)
    crop = vision.RandomResizedCrop(SIZE)
    for i in range(len(source)):
        record = source[i]
        out = crop(dict(record), np.random.default_rng(i))
        (top, left, h, w), flip = crop.params(*vision.image_size(record["image"]),
                                              np.random.default_rng(i))  # fmt: skip
        with Image.open(io.BytesIO(record["image"].tobytes())) as im:
            want = np.asarray(im.convert("RGB").crop((left, top, left + w, top + h))
                              .resize((SIZE, SIZE), Image.Resampling.BILINEAR))  # fmt: skip
        np.testing.assert_array_equal(out["image"], want[:, ::-1] if flip else want)
        assert out["label"] == record["label"]


def test_the_eval_path_is_pillows_resize_then_centre_crop(folder):
    source = meshfeed.ImageFolderSource(folder)
    evaluate = vision.CenterCrop(SIZE, resize=40)
    for i in range(len(source)):
        data = source[i]["image"].tobytes()
        with Image.open(io.BytesIO(data)) as im:
            rgb = im.convert("RGB")
            w, h = rgb.size
            size = (40, int(40 * h / w)) if w <= h else (int(40 * w / h), 40)
            resized = np.asarray(rgb.resize(size, Image.Resampling.BILINEAR))
        top, left = round((resized.shape[0] - SIZE) / 2), round((resized.shape[1] - SIZE) / 2)
        want = resized[top : top + SIZE, left : left + SIZE]
        np.testing.assert_array_equal(evaluate({"image": source[i]["image"]})["image"], want)


def test_the_same_bytes_for_0_or_2_workers_and_threads_and_after_a_restore_elsewhere(folder):
    source = meshfeed.ImageFolderSource(folder)
    crop = vision.RandomResizedCrop(SIZE)
    want = _batches(_loader(source, record_transform=crop))
    assert want[0]["image"].shape == (8, SIZE, SIZE, 3) and want[0]["image"].dtype == np.uint8
    for options in ({"num_workers": 2}, {"num_workers": 2, "worker_type": "threads"}):
        got = _batches(_loader(source, record_transform=crop, **options))
        for a, b in zip(got, want, strict=True):
            for name in b:
                np.testing.assert_array_equal(a[name], b[name])
    first = _loader(source, record_transform=crop, num_workers=2)
    next(iter(first))
    state = first.state()
    first.close()
    on_four = _loader(source, devices=4, record_transform=crop)
    on_four.restore(state)
    for a, b in zip(_batches(on_four), want[1:], strict=True):
        np.testing.assert_array_equal(a["image"], b["image"])


def test_nvimgcodec_decodes_a_chunk_in_the_same_crops_with_the_same_pixels(folder):
    pytest.importorskip("nvidia.nvimgcodec", reason="nvImageCodec is the gpu-decode extra")
    source = meshfeed.ImageFolderSource(folder)
    pillow = _batches(_loader(source, record_transform=vision.RandomResizedCrop(SIZE)))
    for options in ({}, {"num_workers": 2}):  # in the loading process, and in workers
        crop = vision.RandomResizedCrop(SIZE, decoder="nvimgcodec-cpu")
        loader = _loader(source, record_transform=crop, **options)
        nv = [{k: np.asarray(v) for k, v in batch.items()} for batch in loader]
        figures = loader.stats()["record_transform"]
        loader.close()
        assert figures["decoder"] == "nvimgcodec-cpu" and figures["records"] == 16
        for a, b in zip(nv, pillow, strict=True):
            # The CPU codecs are libjpeg-turbo's and OpenCV's PNG, as Pillow's: equal here;
            # another JPEG decoder (the GPU's) may differ by a little.
            assert np.abs(a["image"].astype(int) - b["image"].astype(int)).max() <= 1
            np.testing.assert_array_equal(a["label"], b["label"])


def test_a_chunk_at_once_is_each_record_alone(folder):
    source = meshfeed.ImageFolderSource(folder)
    records = [dict(source[i]) for i in range(6)]
    for decoder in ("pillow", "nvimgcodec-cpu"):
        if decoder != "pillow":
            pytest.importorskip("nvidia.nvimgcodec", reason="nvImageCodec: gpu-decode extra")
        crop = vision.RandomResizedCrop(SIZE, decoder=decoder)
        alone = [crop(r, np.random.default_rng(i)) for i, r in enumerate(records)]
        drawn = [crop.prepare(r, np.random.default_rng(i)) for i, r in enumerate(records)]
        for one, together in zip(alone, crop.batch(records, drawn), strict=True):
            np.testing.assert_array_equal(one["image"], together["image"])


BAD = 13  # row 5 of step 1 in order: inside a chunk, not its first row, for 0 or 2 workers
WORKERS = {
    "0 workers": ({}, "the loading process"),
    "2 processes": ({"num_workers": 2}, "a worker process"),
    "2 threads": ({"num_workers": 2, "worker_type": "threads"}, "a worker thread"),
}
DECODERS = ["pillow", "nvimgcodec-cpu"]
TRUNCATED = {  # each decoder's first line for the JPEG cut in half
    "pillow": r"OSError: image file is truncated",
    "nvimgcodec-cpu": r"ValueError: nvImageCodec \(cpu\) could not decode the image in its region",
}


@pytest.fixture(scope="module")
def truncated(tmp_path_factory):
    return meshfeed.ImageFolderSource(
        folder_with_a_truncated_jpeg(tmp_path_factory.mktemp("truncated") / "train", bad=BAD)
    )


def _crops(source, decoder: str, **options) -> meshfeed.Loader:
    if decoder != "pillow":
        pytest.importorskip("nvidia.nvimgcodec", reason="nvImageCodec is the gpu-decode extra")
    crop = vision.RandomResizedCrop(16, decoder=decoder)  # type: ignore[arg-type]
    return _loader(source, record_transform=crop, shuffle=False, **options)


@pytest.mark.parametrize("decoder", DECODERS)
def test_a_truncated_jpeg_is_named_by_its_id_and_file_whatever_decodes_it(truncated, decoder):
    bad, good = truncated.path(BAD), [truncated.path(i) for i in range(16) if i != BAD]
    for options, where in WORKERS.values():
        loader = _crops(truncated, decoder, **options)
        try:
            with pytest.raises(
                RuntimeError,
                match=rf"^record_transform raised on example {BAD} \({re.escape(bad)}\) in "
                rf"{where}: {TRUNCATED[decoder]}",
            ) as raised:
                list(loader)
        finally:
            loader.close()
        message = str(raised.value)
        assert not [path for path in good if path in message]
        if where == "a worker process":  # its traceback, as text
            assert "\nTraceback (most recent call last):\n" in message
        else:  # the decoder's own error
            assert isinstance(raised.value.__cause__, OSError | ValueError)


@pytest.mark.parametrize("decoder", DECODERS)
def test_a_truncated_jpeg_is_skipped_alone_the_same_whatever_decodes_it(truncated, decoder):
    want = None
    for options, _ in WORKERS.values():
        loader = _crops(truncated, decoder, on_error="skip", **options)
        got = _batches(loader)
        mask = np.concatenate([batch["mask"] for batch in got])
        np.testing.assert_array_equal(mask, np.arange(16) != BAD)
        assert [(s.step, s.example) for s in loader.skipped] == [(1, BAD)]
        assert re.match(TRUNCATED[decoder], loader.skipped[0].error)
        want = want or got
        for a, b in zip(got, want, strict=True):
            for name in b:
                np.testing.assert_array_equal(a[name], b[name])


def test_bad_input_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"size=0 must be an int >= 1"):
        vision.RandomResizedCrop(0)
    with pytest.raises(ValueError, match=r"scale=\(0.5, 0.1\) must be \(low, high\)"):
        vision.RandomResizedCrop(scale=(0.5, 0.1))
    with pytest.raises(ValueError, match=r"resize=100 must be >= size=224"):
        vision.CenterCrop(224, resize=100)
    with pytest.raises(ValueError, match=r"decoder='opencv' is not one of"):
        vision.RandomResizedCrop(decoder="opencv")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"does not fit a 20x30 image"):
        vision.center_crop(20, 30, 24)
    pytest.importorskip("nvidia.nvimgcodec", reason="nvImageCodec is the gpu-decode extra")
    crop = vision.RandomResizedCrop(8, decoder="nvimgcodec-cpu")
    pixels = np.frombuffer(encode(image(np.random.default_rng(0), 20, 20), "JPEG"), np.uint8)
    with pytest.raises(ValueError, match=r"could not decode image 1 of the chunk in its region"):
        crop.batch([{"image": pixels}] * 2, [((0, 0, 8, 8), False), ((10, 10, 30, 30), False)])
