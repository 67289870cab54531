"""The decode workload's per-record functions (importable by worker processes)."""

from __future__ import annotations

import io
import time
from typing import Any

import numpy as np

SIZE = 32
CROP = 28


def encode_all(n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` 32x32 RGB images with some structure (CIFAR's size), PNG-encoded; labels."""
    from PIL import Image

    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[:SIZE, :SIZE]
    encoded = np.empty(n, dtype=object)
    for i in range(n):
        cx, cy, r = rng.uniform(6, 26), rng.uniform(6, 26), rng.uniform(3, 11)
        disc = ((xx - cx) ** 2 + (yy - cy) ** 2 < r * r)[..., None] * rng.integers(0, 200, 3)
        noise = rng.integers(0, 40, (SIZE, SIZE, 3))
        image = np.clip(disc + noise, 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="PNG")
        encoded[i] = buffer.getvalue()
    return encoded, rng.integers(0, 10, n, dtype=np.int32)


def decode_crop(record: dict[str, Any], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Decode and take a random 28x28 crop (meshfeed's record_transform signature)."""
    from PIL import Image

    image = np.asarray(Image.open(io.BytesIO(record["png"])))
    i, j = rng.integers(0, SIZE - CROP + 1, 2)
    return {"image": image[i : i + CROP, j : j + CROP], "label": np.asarray(record["label"])}


def decode_crop_seeded(png: bytes, label: Any, index: int) -> dict[str, np.ndarray]:
    """The same work for a map-style dataset (PyTorch), with a per-index generator."""
    return decode_crop({"png": png, "label": label}, np.random.default_rng(index))


def decode_loop(encoded: np.ndarray, labels: np.ndarray, seconds: float) -> float:
    """Records per second of ``decode_crop`` in a plain loop on this core, for
    ``seconds`` (checked every 256 records)."""
    rng = np.random.default_rng(0)
    done = 0
    start = time.perf_counter()
    while True:
        for j in range(len(labels)):
            decode_crop({"png": encoded[j], "label": labels[j]}, rng)
            done += 1
            if done % 256 == 0 and time.perf_counter() - start >= seconds:
                return done / (time.perf_counter() - start)


def identity(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """The record as it came: a record transform that times only the pipeline."""
    return record
