"""The GPU-host workloads' per-record functions (importable by worker processes)."""

from __future__ import annotations

import io
from typing import Any

import numpy as np

SIZE, CROP = 256, 224  # ImageNet-like: 256x256 JPEGs, a random 224x224 crop


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
