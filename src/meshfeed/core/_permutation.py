"""A keyed permutation of ``[0, n)``, evaluated position by position.

``Permutation(n, seed=, epoch=)`` is a bijection on ``[0, n)`` that is never
materialised: a balanced Feistel network on the smallest even number of bits that
covers ``n``, with *cycle walking* (re-encrypting values that land outside ``[0, n)``;
the domain is below ``4 n``, so on average fewer than four rounds of walking). Memory
is O(positions asked), whatever ``n`` is, so 10^10 examples cost what 10^4 do. Round
keys come from ``np.random.SeedSequence([seed, epoch])``, so the order depends on
nothing but ``(seed, epoch, n)``. The loader's schedule orders each epoch with it, the
packing plan orders documents with it, and ``hash64`` seeds each record's generator.
``PassPermutations`` is the same network with round keys per pass, hashed per position:
a mixture reads each pass over a source in a new order, and a batch whose positions fall
in many passes costs one evaluation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_ROUNDS = 6
_FEW = 16  # values left walking that go on one at a time (``_Feistel._walk``)
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


class _Feistel:
    """A balanced Feistel network on the smallest even number of bits that covers ``n``,
    with cycle walking; its round keys are given per call: one per round, or one per
    round and position."""

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"a permutation needs n >= 1, got n={n}.")
        self.n = n
        bits = max(2, (n - 1).bit_length())
        self._half = (bits + 1) // 2
        self._mask = np.uint64((1 << self._half) - 1)
        self._shift = np.uint64(self._half)

    def _encrypt(self, x: np.ndarray, keys: np.ndarray) -> np.ndarray:
        left, right = x >> self._shift, x & self._mask
        with np.errstate(over="ignore"):
            for key in keys:
                left, right = right, left ^ (hash64(right ^ key) & self._mask)
        return (left << self._shift) | right

    def _decrypt(self, y: np.ndarray, keys: np.ndarray) -> np.ndarray:
        left, right = y >> self._shift, y & self._mask
        with np.errstate(over="ignore"):
            for key in keys[::-1]:
                left, right = right ^ (hash64(left ^ key) & self._mask), left
        return (left << self._shift) | right

    def _walk(self, x: np.ndarray, keys: np.ndarray, forward: bool) -> np.ndarray:
        """``x`` through the network until each value lands in ``[0, n)``. The last few
        values left outside walk on as Python ints: a round of numpy calls costs ~50 us
        whatever the size, and the longest walk of a batch takes tens of rounds."""
        step = self._encrypt if forward else self._decrypt
        out = step(np.asarray(x, dtype=np.uint64), keys)
        outside = np.flatnonzero(out >= self.n)
        while outside.size > _FEW:
            out[outside] = step(out[outside], keys if keys.ndim == 1 else keys[:, outside])
            outside = outside[out[outside] >= self.n]
        for at in outside.tolist():
            own = keys if keys.ndim == 1 else keys[:, at]
            out[at] = self._walk_one(int(out[at]), [int(k) for k in own], forward)
        return out.astype(np.int64)

    def _walk_one(self, value: int, keys: list[int], forward: bool) -> int:
        """One value through the network until it lands in ``[0, n)`` (Python ints,
        the same bits as the arrays' rounds)."""
        half, mask = self._half, (1 << self._half) - 1
        while value >= self.n:
            left, right = value >> half, value & mask
            if forward:
                for key in keys:
                    left, right = right, left ^ (hash64(right ^ key) & mask)
            else:
                for key in reversed(keys):
                    left, right = right ^ (hash64(left ^ key) & mask), left
            value = (left << half) | right
        return value


class Permutation(_Feistel):
    """A keyed bijection on ``[0, n)``, evaluated on arrays of positions."""

    def __init__(self, n: int, *, seed: int, epoch: int) -> None:
        super().__init__(n)
        self._keys = np.random.SeedSequence([seed, epoch]).generate_state(_ROUNDS, np.uint64)

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        return self._walk(positions, self._keys, forward=True)

    def inverse(self, values: np.ndarray) -> np.ndarray:
        """The positions that map to ``values`` (``perm.inverse(perm(p)) == p``)."""
        return self._walk(values, self._keys, forward=False)


class PassPermutations(_Feistel):
    """One keyed bijection on ``[0, n)`` per pass, evaluated on (position, pass) pairs
    at once: a mixture's source read in a new order every pass. Each pass's round keys
    are a hash of the stream's keys and the pass number, computed per pair, so positions
    from many passes cost one evaluation."""

    def __init__(self, n: int, *, seed: int, stream: int) -> None:
        super().__init__(n)
        key = [seed, stream, 0x5A55]  # apart from every Permutation's (seed, epoch)
        self._keys = np.random.SeedSequence(key).generate_state(_ROUNDS, np.uint64)

    def __call__(self, positions: np.ndarray, passes: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            mixed = hash64(np.asarray(passes, np.uint64) * np.uint64(0x9E3779B97F4A7C15))
            keys = hash64(self._keys[:, None] ^ mixed[None, :])
        return self._walk(positions, keys, forward=True)
