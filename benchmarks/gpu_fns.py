"""The image workloads' per-record functions (importable by worker processes), and the
plain loop both ``gpu_host.py`` and ``vision.py`` measure meshfeed against."""

from __future__ import annotations

import io
import pickle
import sys
import time
from typing import Any

import numpy as np

SIZE, CROP = 256, 224  # ImageNet-like: 256x256 JPEGs, a random 224x224 crop
ROW = (CROP, CROP, 3)  # a row of the rows-in-memory workloads


def make_jpegs(n: int, seed: int = 0, height: int = SIZE, width: int = SIZE) -> list[bytes]:
    """``n`` RGB JPEGs (quality 90) with structure and noise: 256x256 (~40-60 KB) by
    default, 375x500 an ImageNet training image's size."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:height, :width]
    out = []
    for _ in range(n):
        base = (np.sin(xx / rng.uniform(8, 40)) + np.cos(yy / rng.uniform(8, 40))) * 60 + 128
        image = base[..., None] + rng.normal(0, 18, (height, width, 3))
        buffer = io.BytesIO()
        Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=90)
        out.append(buffer.getvalue())
    return out


def decode_crop_flip(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """Decode a JPEG, take a random 224x224 crop, flip it half the time."""
    from PIL import Image

    image = np.asarray(Image.open(io.BytesIO(record["jpeg"])).convert("RGB"))
    i, j = rng.integers(0, SIZE - CROP + 1, 2)
    crop = image[i : i + CROP, j : j + CROP]
    if rng.random() < 0.5:
        crop = crop[:, ::-1]
    return {"image": np.ascontiguousarray(crop), "label": np.asarray(record["label"])}


def decode_index(jpeg: bytes, label: int, index: int) -> dict[str, Any]:
    """The same work for a map-style dataset (PyTorch), with a per-index generator."""
    return decode_crop_flip({"jpeg": jpeg, "label": label}, np.random.default_rng(index))


def copy_row(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """The record, copied: a record transform that costs only the pipeline's own work."""
    return {"image": np.array(record["image"]), "label": np.asarray(record["label"])}


def load_jpegs(path: str) -> list[bytes]:
    """The JPEGs ``gpu_host.py`` pickled to ``path`` for its processes."""
    with open(path, "rb") as f:
        return pickle.load(f)


def pillow_crop(data: bytes, rng: np.random.Generator, size: int, augment: bool) -> np.ndarray:
    """``vision.RandomResizedCrop(size)``'s work in plain Pillow calls: decode, crop,
    resize, flip half the time; with ``augment``, TrivialAugmentWide after the flip."""
    from PIL import Image

    import meshfeed.vision as vision

    with Image.open(io.BytesIO(data)) as im:
        top, left, h, w = vision.random_resized_crop(im.height, im.width, rng)
        flip = rng.random() < 0.5
        crop = im.convert("RGB").crop((left, top, left + w, top + h))
    resized = crop.resize((size, size), Image.Resampling.BILINEAR)
    if not augment:
        pixels = np.asarray(resized)
        return np.ascontiguousarray(pixels[:, ::-1]) if flip else pixels
    if flip:
        resized = resized.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    trivial = vision.TrivialAugmentWide()
    return np.asarray(trivial.apply(resized, trivial.params(size, size, rng)))


LOOP = """
import sys
sys.path.insert(0, {here!r})
from gpu_fns import plain_loop
plain_loop({work!r}, {source!r}, {seconds}, augment={augment})
"""
"""The script of one plain loop for ``common.loops_at_once``: ``LOOP.format(here=...,
work=..., source=..., seconds=..., augment=...)``, the arguments of ``plain_loop``."""


def plain_loop(work: str, source: str | list[str], seconds: float, augment: bool = False) -> None:
    """The peer a core gives: a plain loop of ``work`` over JPEGs for ``seconds``, then
    its images/s printed. ``work``: ``"crop_flip"`` (``decode_crop_flip``) or
    ``"resized_crop"`` (``pillow_crop`` to 224); ``source``: a pickle file of the JPEGs'
    bytes, or a list of files read on every pass. Prints ``ready`` and waits for a line
    on stdin first, so that loops started together run together."""
    from PIL import Image  # noqa: F401  (the imports before the clock starts)

    if work == "resized_crop":
        import meshfeed.vision  # noqa: F401

    jpegs = source if isinstance(source, list) else load_jpegs(source)
    print("ready", flush=True)
    sys.stdin.readline()
    rng = np.random.default_rng(0)
    done = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for i, jpeg in enumerate(jpegs):
            if isinstance(jpeg, str):
                with open(jpeg, "rb") as f:
                    jpeg = f.read()
            if work == "crop_flip":
                decode_crop_flip({"jpeg": jpeg, "label": i}, rng)
            else:
                pillow_crop(jpeg, rng, CROP, augment)
        done += len(jpegs)
    print(done / (time.perf_counter() - start), flush=True)
