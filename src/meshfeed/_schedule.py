"""The schedule: which example ids make up each global step.

The schedule is the single source of truth every process computes on its own: step
``k`` covers positions ``[s * B, (s + 1) * B)`` of epoch ``e = k // steps_per_epoch``
(``s = k % steps_per_epoch``, ``B = global_batch_size``), and position ``p`` of epoch
``e`` holds example ``perm_{seed, e}(p)``.

``perm`` is a keyed bijection on ``[0, N)`` evaluated id by id, never materialised: a
balanced Feistel network on the smallest even number of bits that covers ``N``, with
*cycle walking* (re-encrypting values that land outside ``[0, N)``; the domain is below
``4 N``, so on average fewer than four rounds of walking). Memory is O(batch), whatever
``N`` is, so 10^10 examples cost what 10^4 do. Round keys come from
``np.random.SeedSequence([seed, epoch])``, so the order depends on nothing but
``(seed, epoch, N)``.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

LastBatch = Literal["drop", "pad"]
LAST_BATCH: tuple[LastBatch, ...] = ("drop", "pad")
PAD_ID = -1  # the id of a padding row in a step's ids
MASK = "mask"  # with last_batch="pad": the boolean field, True for real rows
_ROUNDS = 6
_BLOCK_POSITIONS = 16384  # ids computed together: amortises numpy's per-call cost
_M64 = (1 << 64) - 1


def hash64(z: Any) -> Any:
    """SplitMix64's finaliser: a cheap, well-mixing function of 64 bits.

    Works on Python ints (masked to 64 bits) and on ``uint64`` arrays (which wrap). The
    schedule's Feistel rounds use it on arrays, record transforms' seeds on ints.
    """
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
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


class Schedule:
    """Step -> global example ids, for one (source length, batch size, seed) triple.

    Args:
      num_examples: examples in the source.
      global_batch_size: rows of one step over all processes.
      shuffle: visit each epoch in a keyed random order; else ``0 .. N-1``.
      seed: the key of the order; epochs get different orders.
      last_batch: ``"drop"`` skips an epoch's final partial batch; ``"pad"`` fills it
        with ``PAD_ID`` (-1).
    """

    def __init__(
        self,
        num_examples: int,
        global_batch_size: int,
        *,
        shuffle: bool,
        seed: int,
        last_batch: LastBatch,
    ) -> None:
        self.num_examples = num_examples
        self.global_batch_size = global_batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.last_batch = last_batch
        if last_batch == "drop":
            self.steps_per_epoch = num_examples // global_batch_size
        else:
            self.steps_per_epoch = -(-num_examples // global_batch_size)
        self._block_steps = max(1, _BLOCK_POSITIONS // global_batch_size)
        # One (key, ids) pair, replaced whole: a reader on another thread sees either
        # the old block or the new one, never the new key with the old ids.
        self._cached: tuple[tuple[int, int], np.ndarray] | None = None
        self._permutation: tuple[int, Permutation] | None = None  # (epoch, its order)

    def epoch_and_step(self, step: int) -> tuple[int, int]:
        return divmod(step, self.steps_per_epoch)

    def ids(self, step: int) -> np.ndarray:
        """The ``global_batch_size`` example ids of global step ``step`` (-1: padding)."""
        epoch, in_epoch = self.epoch_and_step(step)
        block, offset = divmod(in_epoch, self._block_steps)
        cached = self._cached
        if cached is None or cached[0] != (epoch, block):
            cached = ((epoch, block), self._block_ids(epoch, block))
            self._cached = cached
        b = self.global_batch_size
        return cached[1][offset * b : (offset + 1) * b]

    def _block_ids(self, epoch: int, block: int) -> np.ndarray:
        b = self.global_batch_size
        first = block * self._block_steps * b
        last = min(first + self._block_steps * b, self.steps_per_epoch * b)
        positions = np.arange(first, last, dtype=np.int64)
        ids = np.full(positions.shape, PAD_ID, dtype=np.int64)
        real = positions < self.num_examples
        if not self.shuffle:
            ids[real] = positions[real]
            return ids
        permutation = self._permutation
        if permutation is None or permutation[0] != epoch:
            permutation = (epoch, Permutation(self.num_examples, seed=self.seed, epoch=epoch))
            self._permutation = permutation
        ids[real] = permutation[1](positions[real])
        return ids
