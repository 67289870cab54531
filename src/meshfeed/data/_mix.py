"""Mixtures: several sources behind one, in fixed proportions.

``mix([a, b], weights=[0.7, 0.3])`` is itself a ``Source``: example ``k`` of the mixture
is a pure function of ``k``, so the loader shuffles, shards, checkpoints and resumes it
like any other source, and its state is the loader's state. Positions come in blocks of
``BLOCK``; each block holds each source's share of the block (largest-remainder
rounding, so the proportions hold to 1/``BLOCK``), interleaved smoothly (smooth weighted
round robin). A source's ``j``-th appearance is its example ``j mod len(source)``: a
small source repeats, a large one is read in order until the mixture ends.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from meshfeed.data._sources import (
    FieldSpec,
    Source,
    check_ids,
    describe,
    document_lengths,
    gather_by_part,
    thread_safe,
)

BLOCK = 10_000


def _counts(weights: np.ndarray, block: int) -> np.ndarray:
    raw = weights * block
    counts = np.floor(raw).astype(np.int64)
    order = np.argsort(-(raw - counts), kind="stable")
    counts[order[: block - counts.sum()]] += 1
    return counts


def _pattern(counts: np.ndarray) -> np.ndarray:
    """Smooth weighted round robin: which source fills each position of a block."""
    total = int(counts.sum())
    current = np.zeros(len(counts), np.int64)
    out = np.empty(total, np.int64)
    for r in range(total):
        current += counts
        s = int(np.argmax(current))
        out[r] = s
        current[s] -= total
    return out


class Mixture:
    """A deterministic mixture of sources; build with ``meshfeed.mix``."""

    def __init__(
        self, sources: Sequence[Source], weights: Sequence[float], *, length: int | None
    ) -> None:
        self.sources = list(sources)
        w = np.asarray(weights, dtype=np.float64)
        self.weights = (w / w.sum()).tolist()
        self._counts = _counts(np.asarray(self.weights), BLOCK)
        if (self._counts == 0).any():
            small = [i for i, c in enumerate(self._counts.tolist()) if c == 0]
            raise ValueError(
                f"weights {list(weights)} give source(s) {small} no place in a block of "
                f"{BLOCK}; the smallest weight must be at least 1/{BLOCK} of the total."
            )
        self._pattern = _pattern(self._counts)
        prefix = np.zeros((BLOCK + 1, len(self.sources)), np.int64)
        np.add.at(prefix, (np.arange(1, BLOCK + 1), self._pattern), 1)
        self._prefix = np.cumsum(prefix, axis=0)
        self._lengths = [len(s) for s in self.sources]
        self._len = length if length is not None else self._covering_length()

    def _covering_length(self) -> int:
        """The shortest mixture that shows every example of every source at least once."""
        ends = []
        for i, n in enumerate(self._lengths):
            c = int(self._counts[i])
            blocks = (n - 1) // c
            left = n - blocks * c
            r = int(np.searchsorted(self._prefix[:, i], left))
            ends.append(blocks * BLOCK + r)
        return max(ends)

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        """Each field's shape and dtype (per example), by name."""
        return self.sources[0].fields

    @property
    def thread_safe(self) -> bool:
        """Whether ``source[ids]`` may run on several threads at once (if every source's may)."""
        return all(thread_safe(s) for s in self.sources)

    def __len__(self) -> int:
        """The number of positions of the mixture."""
        return self._len

    @property
    def fingerprint(self) -> dict[str, Any]:
        """What the mixture's order depends on (the loader's state carries it)."""
        return {"weights": self.weights, "lengths": self._lengths, "length": self._len}

    def locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source index, example id in that source) of each mixture id."""
        ids = np.asarray(ids, dtype=np.int64)
        block, r = np.divmod(ids, BLOCK)
        which = self._pattern[r]
        seen = block * self._counts[which] + self._prefix[r, which]
        return which, seen % np.asarray(self._lengths, dtype=np.int64)[which]

    def __getitem__(self, ids: np.ndarray) -> dict[str, Any]:
        """The examples at positions ``ids``, each read from the source that position names."""
        ids = check_ids(ids, self._len, "this mixture")
        which, local = self.locate(ids)
        return gather_by_part(which, local, self.fields, lambda s, rows: self.sources[s][rows])

    def lengths(self, field: str) -> np.ndarray:
        """Every document's length in the ragged ``field``, from each source's lengths."""
        if field not in self.fields or not self.fields[field].ragged:
            raise ValueError(f"lengths({field!r}): that is not a ragged field of this mixture.")
        per_source = [document_lengths(s, field) for s in self.sources]
        out = np.empty(self._len, np.int64)
        for a in range(0, self._len, BLOCK * 16):  # a chunk at a time: no N-sized ids
            which, local = self.locate(np.arange(a, min(self._len, a + BLOCK * 16)))
            for s in np.unique(which).tolist():
                where = np.flatnonzero(which == s)
                out[a + where] = per_source[s][local[where]]
        return out

    def __repr__(self) -> str:
        parts = ", ".join(f"{w:.3g}" for w in self.weights)
        return f"Mixture({len(self.sources)} sources, weights [{parts}], {self._len} examples)"


def mix(
    sources: Sequence[Source], weights: Sequence[float], *, length: int | None = None
) -> Mixture:
    """A deterministic, resumable mixture of ``sources`` in proportions ``weights``.

    Args:
      sources: sources with the same fields (names, shapes, dtypes).
      weights: one positive number per source (normalised to sum to 1).
      length: examples in the mixture; default the shortest mixture in which every
        example of every source appears at least once.

    Returns:
      A ``Source``; load it with ``meshfeed.Loader`` like any other.
    """
    if isinstance(sources, Source) or not isinstance(sources, Sequence) or not sources:
        raise TypeError(
            "mix takes a non-empty list of sources, e.g. mix([a, b], weights=[0.7, 0.3])."
        )
    for i, s in enumerate(sources):
        if not isinstance(s, Source):
            raise TypeError(f"sources[{i}] is a {type(s).__name__}, not a meshfeed.Source.")
        if len(s) == 0:
            raise ValueError(f"sources[{i}] has no examples.")
    if len(weights) != len(sources):
        raise ValueError(f"mix got {len(sources)} sources but {len(weights)} weights.")
    if not all(isinstance(w, int | float) and math.isfinite(w) and w > 0 for w in weights):
        raise ValueError(f"weights {list(weights)} must be finite numbers > 0.")
    first = dict(sources[0].fields)
    for i, s in enumerate(sources[1:], start=1):
        if dict(s.fields) != first:
            raise ValueError(
                f"sources[{i}] has fields {describe(s.fields)}, sources[0] has "
                f"{describe(first)}; every "
                "source of a mixture needs the same fields, shapes and dtypes."
            )
    if length is not None and (not isinstance(length, int) or length < 1):
        raise ValueError(f"length={length!r} must be an int >= 1, or None.")
    return Mixture(sources, weights, length=length)
