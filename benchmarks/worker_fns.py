"""What worker processes import by name: the per-record functions of the image, fault and
Ray benchmarks, their data, and the plain loop meshfeed is measured against."""

from __future__ import annotations

import io
import pickle
import sys
import time
from typing import Any

import decode_fns
import numpy as np

SIZE, CROP = 256, 224  # ImageNet-like: 256x256 JPEGs, a random 224x224 crop
ROW = (CROP, CROP, 3)  # a row of the rows-in-memory workloads
BAD_EVERY = 100  # example ids divisible by this are bad: 1% of them
SLEEP_S = 0.002  # per record: a worker does at most 500 records/s


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


# One plain loop for ``common.loops_at_once``: ``here`` and ``plain_loop``'s arguments.
LOOP = """
import sys
sys.path.insert(0, {here!r})
from worker_fns import plain_loop
plain_loop({work!r}, {source!r}, {seconds}, augment={augment})
"""


def plain_loop(work: str, source: str | list[str], seconds: float, augment: bool = False) -> None:
    """A plain loop of ``work`` (``"crop_flip"`` or ``"resized_crop"``: ``pillow_crop`` to
    224) over the JPEGs of ``source`` (a pickle file, or files read on every pass) for
    ``seconds``, then its images/s printed; ``ready`` and a line on stdin first."""
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


def pngs(n: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Workload C's ``n`` PNG-encoded images and labels, clean and with every image whose
    id is a multiple of ``BAD_EVERY`` cut to its first half (a truncated file)."""
    encoded, labels = decode_fns.encode_all(n)
    bad = encoded.copy()
    for i in range(0, n, BAD_EVERY):
        bad[i] = encoded[i][: len(encoded[i]) // 2]
    return {"png": encoded, "label": labels}, {"png": bad, "label": labels}


def is_bad(ids: np.ndarray) -> np.ndarray:
    """Which of ``ids`` are bad in the second source of ``pngs(n)``."""
    return (ids >= 0) & (ids % BAD_EVERY == 0)


def decode_crop_checked(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """``decode_crop``, raising ``ValueError`` on an image that does not decode (PIL
    raises ``OSError`` on a truncated PNG)."""
    try:
        return decode_fns.decode_crop(record, rng)
    except (OSError, SyntaxError) as error:
        raise ValueError(f"the image does not decode: {error}") from error


def dequantize(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """uint8 -> float32 in [0, 1) plus uniform noise of one level from the example's
    generator: a cheap record transform whose output is 4x its input."""
    image = record["image"]
    noise = rng.random(image.shape, dtype=np.float32)
    return {"image": (image.astype(np.float32) + noise) * (1 / 256), "label": record["label"]}


def sleep_crop(record: dict[str, Any], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Waits ``SLEEP_S`` (a remote core's decode, say: a worker bound by latency, not by
    this machine's cores), then a random 28x28 crop of a 32x32 image."""
    time.sleep(SLEEP_S)
    i, j = rng.integers(0, decode_fns.SIZE - decode_fns.CROP + 1, 2)
    crop = record["image"][i : i + decode_fns.CROP, j : j + decode_fns.CROP]
    return {"image": crop, "label": record["label"]}
