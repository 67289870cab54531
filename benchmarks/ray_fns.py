"""The Ray benchmark's per-record functions (importable by its Ray record workers).

The PNG workload reuses ``decode_fns.decode_crop``; this module adds the stand-in for a
remote core: a record transform that waits instead of computing, so a worker is bound
by latency, not by this machine's two cores.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

SIDE = 32
CROP = 28
SLEEP_S = 0.002  # per record: a worker does at most 500 records/s


def images(n: int) -> dict[str, np.ndarray]:
    """``n`` random 32x32x3 uint8 images and int32 labels (what the waiting transform reads)."""
    rng = np.random.default_rng(0)
    return {
        "image": rng.integers(0, 256, (n, SIDE, SIDE, 3), dtype=np.uint8),
        "label": rng.integers(0, 10, n, dtype=np.int32),
    }


def sleep_crop(record: dict[str, Any], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Waits ``SLEEP_S`` (a remote core's decode, say), then a random 28x28 crop."""
    time.sleep(SLEEP_S)
    i, j = rng.integers(0, SIDE - CROP + 1, 2)
    return {"image": record["image"][i : i + CROP, j : j + CROP], "label": record["label"]}
