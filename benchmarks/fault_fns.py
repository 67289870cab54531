"""The faults benchmark's data and per-record functions (importable by worker processes)."""

from __future__ import annotations

from typing import Any

import numpy as np
from decode_fns import decode_crop, encode_all

BAD_EVERY = 100  # example ids divisible by this are bad: 1% of them


def pngs(n: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Workload C's ``n`` PNG-encoded images and labels, clean and with every image whose
    id is a multiple of ``BAD_EVERY`` cut to its first half (a truncated file)."""
    encoded, labels = encode_all(n)
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
        return decode_crop(record, rng)
    except (OSError, SyntaxError) as error:
        raise ValueError(f"the image does not decode: {error}") from error


def dequantize(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """uint8 -> float32 in [0, 1) plus uniform noise of one level from the example's
    generator: a cheap record transform whose output is 4x its input."""
    image = record["image"]
    noise = rng.random(image.shape, dtype=np.float32)
    return {"image": (image.astype(np.float32) + noise) * (1 / 256), "label": record["label"]}
