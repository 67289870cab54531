"""The soak run's per-record augmentation (importable by worker processes)."""

from __future__ import annotations

from typing import Any

import numpy as np


def shift(record: dict[str, Any], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Shifts the 8x8 digit by up to one pixel each way (zeros come in)."""
    dy, dx = rng.integers(-1, 2, 2)
    image = np.roll(record["image"], (int(dy), int(dx)), axis=(0, 1))
    return {"image": image, "label": record["label"]}
