"""Which source fills each position of a mixture, and which of its examples.

Positions come in *segments*. A segment of constant weights repeats a period of
``BLOCK`` positions that holds each source's share of it (largest-remainder rounding)
spread evenly through the period; it starts afresh at its first position. While the
weights blend from one stage to the next, each step is a segment of its own: its period
is that step's positions, and its counts follow the blend, with the rounding carried
from step to step so the shares over the blend are right to one example. For every
segment the order keeps each source's draws before it, so a position's source and which
draw of that source it is are a few array lookups: nothing per position is stored, and
a source continues where it stopped when the weights change.

The ``j``-th draw of a source of ``n`` examples is in pass ``j // n``; with ``shuffle``
it is example ``perm(j % n)`` of a keyed permutation of the source (seed, source,
pass): every pass a new order, each example once per pass. Without, it is ``j % n``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from meshfeed.core._permutation import PassPermutations
from meshfeed.core._stages import BatchSizes, Stages

BLOCK = 10_000
Weights = tuple[float, ...]


def shares(weights: np.ndarray, total: int) -> np.ndarray:
    """``total`` split in proportion to ``weights`` (summing to 1), largest remainder."""
    raw = weights * total
    counts = np.floor(raw).astype(np.int64)
    order = np.argsort(-(raw - counts), kind="stable")
    counts[order[: total - int(counts.sum())]] += 1
    return counts


def _allocate(target: np.ndarray, total: int) -> np.ndarray:
    """Non-negative ints summing to ``total``, each within one of ``target`` where it can."""
    counts = np.maximum(np.floor(target), 0).astype(np.int64)
    while counts.sum() > total:
        counts[np.argmax(np.where(counts > 0, counts - target, -np.inf))] -= 1
    while counts.sum() < total:
        counts[np.argmax(target - counts)] += 1
    return counts


@functools.lru_cache(maxsize=64)
def _interleave(counts: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """A period holding ``counts[s]`` positions of each source ``s``, each source's
    spread evenly, and the running count of each source before each position."""
    keys = np.concatenate([(np.arange(c) + 0.5) / c for c in counts if c])
    which = np.concatenate([np.full(c, s, np.int64) for s, c in enumerate(counts) if c])
    pattern = which[np.argsort(keys, kind="stable")]
    prefix = np.zeros((len(pattern) + 1, len(counts)), np.int64)
    prefix[np.arange(1, len(pattern) + 1), pattern] = 1
    np.cumsum(prefix, axis=0, out=prefix)
    return pattern, prefix


class MixOrder:
    """Positions -> (source, example) for weights by stage over steps of ``sizes``.

    Args:
      stages: the weights (normalised) by stage, in steps.
      sizes: the positions each step reads.
      lengths: each source's examples.
      seed: the key of each pass's order.
      shuffle: a new keyed order every pass; else each pass in order.
    """

    def __init__(
        self,
        stages: Stages[Weights],
        sizes: BatchSizes,
        lengths: Sequence[int],
        *,
        seed: int,
        shuffle: bool,
    ) -> None:
        self.lengths = np.asarray(lengths, np.int64)
        self.seed = seed
        self.shuffle = shuffle
        starts: list[int] = []
        periods: list[int] = []
        counts: list[np.ndarray] = []
        for i, stage in enumerate(stages):
            w = np.asarray(stage.value)
            if stage.blend:
                before = np.asarray(stages.stages[i - 1].value)
                carry = np.zeros(len(w))
                for t in range(stage.blend):
                    step = stage.start + t
                    b = sizes.size(step)
                    target = b * (before + (w - before) * (t + 1) / (stage.blend + 1)) + carry
                    c = _allocate(target, b)
                    carry = target - c
                    starts.append(sizes.position(step))
                    periods.append(b)
                    counts.append(c)
            starts.append(sizes.position(stage.start + stage.blend))
            periods.append(BLOCK)
            counts.append(shares(w, BLOCK))
        self.starts = np.array(starts, np.int64)
        self.periods = np.array(periods, np.int64)
        self.counts = np.stack(counts)
        self.base = np.zeros_like(self.counts)  # each source's draws before each segment
        for g in range(len(starts) - 1):
            span = int(self.starts[g + 1] - self.starts[g])
            whole, rest = divmod(span, int(self.periods[g]))
            self.base[g + 1] = self.base[g] + whole * self.counts[g]
            if rest:
                self.base[g + 1] += self._period(g)[1][rest]
        self._orders = [
            PassPermutations(int(n), seed=seed, stream=s) for s, n in enumerate(self.lengths)
        ]

    def _period(self, g: int) -> tuple[np.ndarray, np.ndarray]:
        return _interleave(tuple(self.counts[g].tolist()))

    def draws(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, which draw of that source) of each position."""
        p = np.asarray(positions, np.int64)
        if len(self.starts) == 1:  # fixed weights: one segment
            g = np.zeros(len(p), np.int64)
            parts: list[tuple[int, Any]] = [(0, slice(None))]
        else:
            g = np.searchsorted(self.starts, p, side="right") - 1
            parts = [(seg, np.flatnonzero(g == seg)) for seg in np.unique(g).tolist()]
        block, r = np.divmod(p - self.starts[g], self.periods[g])
        which = np.empty(len(p), np.int64)
        draw = np.empty(len(p), np.int64)
        for seg, at in parts:
            pattern, prefix = self._period(seg)
            s = pattern[r[at]]
            which[at] = s
            draw[at] = self.base[seg, s] + block[at] * self.counts[seg, s] + prefix[r[at], s]
        return which, draw

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, example of that source) of each position."""
        which, draw = self.draws(positions)
        passes, local = np.divmod(draw, self.lengths[which])
        if not self.shuffle:
            return which, local
        if len(which) and (which == which[0]).all():
            return which, self._orders[int(which[0])](local, passes)
        out = np.empty_like(local)
        for s in np.unique(which).tolist():
            at = np.flatnonzero(which == s)
            out[at] = self._orders[s](local[at], passes[at])
        return which, out

    def position_of(self, source: int, draw: int) -> int | None:
        """The position of the ``draw``-th draw of ``source``; ``None`` if it never comes."""
        # The last segment whose draws before it are at most ``draw`` holds it: a segment
        # without the source has the same count before it as the one after.
        g = int(np.searchsorted(self.base[:, source], draw, side="right")) - 1
        count = int(self.counts[g, source])
        if count == 0:  # only the last segment, which never ends, can lack it here
            return None
        block, rest = divmod(draw - int(self.base[g, source]), count)
        r = int(np.searchsorted(self._period(g)[1][:, source], rest + 1)) - 1
        return int(self.starts[g] + block * self.periods[g] + r)
