"""Module-level helpers for ragged-field tests (worker processes import them by name)."""

from __future__ import annotations

from typing import Any

import numpy as np

import meshfeed

WIDTH = 16


def documents(n: int = 50, seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 1000, k).astype(np.int32) for k in rng.integers(0, 30, n)]


def write_part(path: str, index: int, count: int) -> None:
    """One worker's part of a dataset: documents ``index::count``."""
    docs = documents(40)[index::count]
    meshfeed.write_source(
        path,
        {"tokens": docs, "id": np.arange(index, 40, count)},
        shard_size=4,
        part=(index, count),
    )


def pad(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """A document padded (or cut) to WIDTH tokens, with its true length."""
    tokens = record["tokens"][:WIDTH]
    return {
        "tokens": np.pad(tokens, (0, WIDTH - len(tokens))),
        "length": np.int32(len(tokens)),
    }
