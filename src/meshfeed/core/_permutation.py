"""A keyed permutation of ``[0, n)``, evaluated position by position.

``Permutation(n, seed=, epoch=)`` is a bijection on ``[0, n)`` that is never
materialised: a balanced Feistel network on the smallest even number of bits that
covers ``n``, with *cycle walking* (re-encrypting values that land outside ``[0, n)``;
the domain is below ``4 n``, so on average fewer than four rounds of walking). Memory
is O(positions asked), whatever ``n`` is, so 10^10 examples cost what 10^4 do. Round
keys come from ``np.random.SeedSequence([seed, epoch])``, so the order depends on
nothing but ``(seed, epoch, n)``. The loader's schedule orders each epoch with it, the
packing plan orders documents with it, and ``hash64`` seeds each record's generator.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_ROUNDS = 6
M64 = (1 << 64) - 1
"""Python ints are masked to 64 bits with this."""


def hash64(z: Any) -> Any:
    """SplitMix64's finaliser: a cheap, well-mixing function of 64 bits.

    Works on Python ints (masked to 64 bits) and on ``uint64`` arrays (which wrap). The
    schedule's Feistel rounds use it on arrays, record transforms' seeds on ints.
    """
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


class Permutation:
    """A keyed bijection on ``[0, n)``, evaluated on arrays of positions."""

    def __init__(self, n: int, *, seed: int, epoch: int) -> None:
        if n < 1:
            raise ValueError(f"Permutation needs n >= 1, got n={n}.")
        self.n = n
        bits = max(2, (n - 1).bit_length())
        self._half = (bits + 1) // 2
        self._mask = np.uint64((1 << self._half) - 1)
        self._shift = np.uint64(self._half)
        self._keys = np.random.SeedSequence([seed, epoch]).generate_state(_ROUNDS, np.uint64)

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self._shift, x & self._mask
        with np.errstate(over="ignore"):
            for key in self._keys:
                left, right = right, left ^ (hash64(right ^ key) & self._mask)
        return (left << self._shift) | right

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        out = self._encrypt(np.asarray(positions, dtype=np.uint64))
        outside = np.flatnonzero(out >= self.n)
        while outside.size:
            out[outside] = self._encrypt(out[outside])
            outside = outside[out[outside] >= self.n]
        return out.astype(np.int64)

    def _decrypt(self, y: np.ndarray) -> np.ndarray:
        left, right = y >> self._shift, y & self._mask
        with np.errstate(over="ignore"):
            for key in self._keys[::-1]:
                left, right = right ^ (hash64(left ^ key) & self._mask), left
        return (left << self._shift) | right

    def inverse(self, values: np.ndarray) -> np.ndarray:
        """The positions that map to ``values`` (``perm.inverse(perm(p)) == p``)."""
        out = self._decrypt(np.asarray(values, dtype=np.uint64))
        outside = np.flatnonzero(out >= self.n)
        while outside.size:  # cycle walking, backwards
            out[outside] = self._decrypt(out[outside])
            outside = outside[out[outside] >= self.n]
        return out.astype(np.int64)
