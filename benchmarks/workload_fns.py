"""The image arrays the workloads of several benchmarks share (importable by workers)."""

from __future__ import annotations

import numpy as np


def images(n: int, side: int = 32, channels: int = 3) -> dict[str, np.ndarray]:
    """``n`` random ``side`` x ``side`` uint8 images of ``channels`` and int32 labels."""
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (n, side, side, channels), dtype=np.uint8)
    return {"image": image, "label": rng.integers(0, 10, n, dtype=np.int32)}
