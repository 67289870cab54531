"""The schedule: which example ids make up each global step.

The schedule is the single source of truth every process computes on its own: step
``k`` covers positions ``[s * B, (s + 1) * B)`` of epoch ``e = k // steps_per_epoch``
(``s = k % steps_per_epoch``, ``B = global_batch_size``), and position ``p`` of epoch
``e`` holds example ``perm_{seed, e}(p)``.

``perm`` is ``core._permutation.Permutation``: a keyed bijection on ``[0, N)``
evaluated id by id, never materialised, so memory is O(batch) whatever ``N`` is, and the
order depends on nothing but ``(seed, epoch, N)``.

With ``block=k`` (``Loader(shuffle_block=k)``) the order reads runs instead of single
rows, for data behind a URL (``BlockOrder``): the examples are cut into blocks of ``k``
consecutive ids, the blocks are permuted (the same keyed bijection, over blocks), and
each window of ``window`` blocks in that order is visited round-robin -- one row of each
block in turn, each block from a keyed starting row, wrapping around. So ``B``
consecutive positions take about ``B / window`` consecutive rows from each block of
their window: each process reads a few contiguous runs per step, and each block is read
once per epoch. It is still a pure function of ``(seed, epoch, N, k, window)`` evaluated
position by position, in O(batch) memory.

With a batch size by stages (``RampSchedule``) epochs are counted in examples instead:
step ``k`` covers positions ``[P(k), P(k) + B(k))`` right after every earlier step's
(``core._stages.BatchSizes``), position ``p`` is position ``p mod N`` of epoch
``p // N``, and a step may straddle two epochs. Only the run's last step can be partial.
A fixed batch size keeps the epoch-aligned steps above.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from meshfeed.core._permutation import M64, Permutation, hash64
from meshfeed.core._stages import BatchSizes

LastBatch = Literal["drop", "pad"]
"""What the loader does with each epoch's final partial batch: drop it, or pad it with
zero rows marked False in a ``mask`` field."""
LAST_BATCH: tuple[LastBatch, ...] = ("drop", "pad")
PAD_ID = -1  # the id of a padding row in a step's ids
MASK = "mask"  # with last_batch="pad": the boolean field, True for real rows
_BLOCK_POSITIONS = 16384  # ids computed together: amortises numpy's per-call cost


class BlockOrder:
    """One epoch's block-shuffled order: position -> example id (module docstring)."""

    def __init__(self, n: int, block: int, window: int, *, seed: int, epoch: int) -> None:
        self.n = n
        self.k = min(block, n)
        self.blocks = -(-n // self.k)
        self.w = min(window, self.blocks)
        self._order = Permutation(self.blocks, seed=seed, epoch=epoch)
        self._key = np.uint64(hash64((seed * 0x9E3779B97F4A7C15 + epoch) & M64))
        self._last = n - (self.blocks - 1) * self.k  # rows of the last block, 1 .. k
        self._short = self.k - self._last  # rows it lacks
        # The window that holds the short block: the windows after it start earlier.
        slot = int(self._order.inverse(np.array([self.blocks - 1]))[0])
        self._short_window, self._short_slot = divmod(slot, self.w)

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        k, w, span = self.k, self.w, self.k * self.w
        p = np.asarray(positions, np.int64)
        after = p >= (self._short_window + 1) * span - self._short
        window = np.where(after, (p + self._short) // span, p // span)
        q = p - window * span + np.where(after, self._short, 0)  # position in its window
        blocks_in = np.minimum(w, self.blocks - window * w)  # blocks in each window
        rounds_full = np.where(window == self._short_window, self._last, k)
        # Rounds before rounds_full visit every block of the window; later rounds skip
        # the short block, which has run out.
        early = q < rounds_full * blocks_in
        late_q = q - rounds_full * blocks_in
        late_blocks = np.maximum(blocks_in - 1, 1)
        row = np.where(early, q // blocks_in, rounds_full + late_q // late_blocks)
        slot = np.where(early, q % blocks_in, late_q % late_blocks)
        slot = np.where(~early & (slot >= self._short_slot), slot + 1, slot)
        block = self._order(window * w + slot)
        size = np.where(block == self.blocks - 1, self._last, k)
        with np.errstate(over="ignore"):
            start = hash64(block.astype(np.uint64) ^ self._key) % size.astype(np.uint64)
        return block * k + (row + start.astype(np.int64)) % size


class Schedule:
    """Step -> global example ids, for one (source length, batch size, seed) triple.

    Args:
      num_examples: examples in the source.
      global_batch_size: rows of one step over all processes.
      shuffle: visit each epoch in a keyed random order; else ``0 .. N-1``.
      seed: the key of the order; epochs get different orders.
      last_batch: ``"drop"`` skips an epoch's final partial batch; ``"pad"`` fills it
        with ``PAD_ID`` (-1).
      block: shuffle blocks of this many consecutive examples, read as runs
        (``BlockOrder``); ``None``: shuffle single examples.
      window: with ``block``, the blocks visited together.
    """

    def __init__(
        self,
        num_examples: int,
        global_batch_size: int,
        *,
        shuffle: bool,
        seed: int,
        last_batch: LastBatch,
        block: int | None = None,
        window: int = 1,
    ) -> None:
        self.num_examples = num_examples
        self.global_batch_size = global_batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.last_batch = last_batch
        self.block = block
        self.window = window
        if last_batch == "drop":
            self.steps_per_epoch = num_examples // global_batch_size
        else:
            self.steps_per_epoch = -(-num_examples // global_batch_size)
        self._block_steps = max(1, _BLOCK_POSITIONS // global_batch_size)
        # One (key, ids) pair, replaced whole: a reader on another thread sees either
        # the old block or the new one, never the new key with the old ids.
        self._cached: tuple[tuple[int, int], np.ndarray] | None = None
        self._permutation: tuple[int, Permutation | BlockOrder] | None = None  # (epoch, order)

    def epoch_and_step(self, step: int) -> tuple[int, int]:
        """``(epoch, step within the epoch)`` of global step ``step``."""
        return divmod(step, self.steps_per_epoch)

    def size(self, step: int) -> int:
        """Rows of step ``step``."""
        return self.global_batch_size

    def epochs(self, step: int) -> np.ndarray:
        """The epoch of each row of step ``step``."""
        return np.full(self.global_batch_size, step // self.steps_per_epoch, np.int64)

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
            permutation = (epoch, self._order(epoch))
            self._permutation = permutation
        ids[real] = permutation[1](positions[real])
        return ids

    def _order(self, epoch: int) -> Permutation | BlockOrder:
        return order(self.num_examples, self.seed, epoch, self.block, self.window)


def order(
    n: int, seed: int, epoch: int, block: int | None, window: int
) -> Permutation | BlockOrder:
    """The order of one epoch: single examples, or blocks of ``block``."""
    if block is None:
        return Permutation(n, seed=seed, epoch=epoch)
    return BlockOrder(n, block, window, seed=seed, epoch=epoch)


class RampSchedule:
    """Step -> global example ids under a batch size by stages (module docstring).

    Args:
      num_examples: examples in the source.
      sizes: the rows of each step.
      shuffle, seed, block, window: as for ``Schedule``.
      total: positions in the whole run (``num_epochs * N``); ``None``: endless. Ids
        past it are ``PAD_ID``.
    """

    steps_per_epoch = None  # steps do not line up with epochs

    def __init__(
        self,
        num_examples: int,
        sizes: BatchSizes,
        *,
        shuffle: bool,
        seed: int,
        total: int | None,
        block: int | None = None,
        window: int = 1,
    ) -> None:
        self.num_examples = num_examples
        self.sizes = sizes
        self.total = total
        self.shuffle = shuffle
        self.seed = seed
        self.block = block
        self.window = window
        self._chunk = max(_BLOCK_POSITIONS, max(sizes.distinct))
        # Recent chunks of ids and epoch orders, each dict replaced whole (see Schedule).
        self._chunks: dict[int, np.ndarray] = {}
        self._orders: dict[int, Permutation | BlockOrder] = {}

    def size(self, step: int) -> int:
        """Rows of step ``step``."""
        return self.sizes.size(step)

    def epochs(self, step: int) -> np.ndarray:
        """The epoch of each row of step ``step`` (two, where it straddles them;
        padding past the end of the run counts in the last epoch)."""
        first = self.sizes.position(step)
        positions = np.arange(first, first + self.size(step))
        if self.total is not None:
            positions = np.minimum(positions, self.total - 1)
        return positions // self.num_examples

    def ids(self, step: int) -> np.ndarray:
        """The example ids of step ``step`` (-1: padding past the end of the run)."""
        first = self.sizes.position(step)
        last = first + self.size(step)
        a, b = first // self._chunk, (last - 1) // self._chunk
        parts = [self._ids_of_chunk(c) for c in range(a, b + 1)]
        ids = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return ids[first - a * self._chunk : last - a * self._chunk]

    def _ids_of_chunk(self, c: int) -> np.ndarray:
        chunks = self._chunks
        ids = chunks.get(c)
        if ids is None:
            ids = self._compute(np.arange(c * self._chunk, (c + 1) * self._chunk))
            self._chunks = {**{k: v for k, v in chunks.items() if abs(k - c) <= 1}, c: ids}
        return ids

    def _compute(self, positions: np.ndarray) -> np.ndarray:
        n = self.num_examples
        ids = np.full(positions.shape, PAD_ID, np.int64)
        real = positions < self.total if self.total is not None else np.ones(len(ids), bool)
        epoch, local = np.divmod(positions, n)
        if not self.shuffle:
            ids[real] = local[real]
            return ids
        for e in np.unique(epoch[real]).tolist():
            at = real & (epoch == e)
            ids[at] = self._order(e)(local[at])
        return ids

    def _order(self, epoch: int) -> Permutation | BlockOrder:
        orders = self._orders
        found = orders.get(epoch)
        if found is None:
            found = order(self.num_examples, self.seed, epoch, self.block, self.window)
            self._orders = {
                **{k: v for k, v in orders.items() if abs(k - epoch) <= 1},
                epoch: found,
            }
        return found
