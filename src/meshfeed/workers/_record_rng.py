"""Each record's random generator: a PCG64 keyed by ``(seed, epoch, example id)``.

A record transform's ``rng`` depends on nothing but the example, the seed and the
epoch: not on the number of workers, their kind, nor the number of processes, so a
record is the same bytes wherever and however often it is computed. ``RecordRng`` keys
a chunk's generators at once and re-seeds one generator in place for each record (for
speed: a record transform must use it within its call).
"""

from __future__ import annotations

import ctypes
import functools
import threading
from typing import Any

import numpy as np

from meshfeed.core._permutation import M64, hash64

_M128 = (1 << 128) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # SplitMix64's increment


def _splitmix64(z: Any) -> Any:
    """SplitMix64's step, on a Python int or on a ``uint64`` array (which wraps)."""
    if isinstance(z, np.ndarray):
        return hash64(z + np.uint64(_GOLDEN))
    return hash64((z + _GOLDEN) & M64)


def example_keys(seed: int, epoch: int, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The two 64-bit keys of each example's generator, for all of ``ids`` at once."""
    base = _splitmix64(_splitmix64(seed) ^ epoch)
    with np.errstate(over="ignore"):
        a = _splitmix64(np.uint64(base) ^ np.asarray(ids).astype(np.uint64))
        b = _splitmix64(a)
    return a, b


def _state_words(bits: np.random.PCG64) -> tuple[memoryview, memoryview] | None:
    """Views of ``bits``'s state in memory, if numpy lays it out as this expects.

    numpy's ``ctypes.state_address`` points at ``{pcg64_random_t *state; int
    has_uint32; uint32_t uinteger}``, and the ``pcg64_random_t`` at the 128-bit state and
    increment, low words first. The layout is checked once a process against the
    ``state`` setter (``_layout_ok``), so a numpy that lays it out differently gets
    ``None`` and the setter is used.
    """
    views = _views(bits) if _layout_ok() else None
    if views is None:
        return None
    header, words = views
    return header.data.cast("B").cast("Q"), words.data.cast("B").cast("Q")


def _views(bits: np.random.PCG64) -> tuple[np.ndarray, np.ndarray] | None:
    try:
        address = bits.ctypes.state_address
        header = np.ctypeslib.as_array((ctypes.c_uint64 * 2).from_address(address))
        words = np.ctypeslib.as_array((ctypes.c_uint64 * 4).from_address(int(header[0])))
    except (AttributeError, TypeError, ValueError):
        return None
    return header, words


@functools.cache
def _layout_ok() -> bool:
    """Whether writing the state words in place works here (checked once a process)."""
    bits = np.random.PCG64(0)
    views = _views(bits)
    return views is not None and _layout_holds(bits, *views)


def _layout_holds(bits: np.random.PCG64, header: np.ndarray, words: np.ndarray) -> bool:
    """Writing the words gives what the ``state`` setter gives: the words, the draws."""
    try:
        generator = np.random.Generator(bits)
        for a, b in ((0x0123456789ABCDEF, 0xFEDCBA9876543210), (7, 11)):
            _set_state(bits, a, b)
            generator.integers(0, 1000)  # leaves a buffered 32-bit half behind
            draws = generator.integers(0, 1 << 62, 4)
            _set_state(bits, a, b)
            if words.tolist() != _words(a, b):
                return False
            header[1] = 7  # a stale buffered half, which the fast path must clear
            words[:] = _words(a, b)
            header[1] = 0
            generator.integers(0, 1000)
            if generator.integers(0, 1 << 62, 4).tolist() != draws.tolist():
                return False
    except (TypeError, ValueError, OverflowError):
        return False
    return True


def _words(a: int, b: int) -> list[int]:
    """The four 64-bit words of the state ``(a << 64) | b`` and increment ``2b + 1``."""
    return [b, a, ((b << 1) | 1) & M64, b >> 63]


def _set_state(bits: np.random.PCG64, a: int, b: int) -> None:
    bits.state = {
        "bit_generator": "PCG64",
        "state": {"state": (a << 64) | b, "inc": ((b << 1) | 1) & _M128},
        "has_uint32": 0,
        "uinteger": 0,
    }


class RecordRng:
    """Per-example generators without a SeedSequence per example.

    ``keyed(seed, epoch, ids)`` hashes ``(seed, epoch, id)`` for a chunk of examples at
    once with SplitMix64 into each one's two 64-bit keys; ``at(i)`` re-seeds one PCG64
    (state ``(a << 64) | b``, increment ``2b + 1``) from example ``i``'s keys and returns
    its ``Generator``, which is therefore valid until the next call: a record transform
    must use it within its call, not keep it. Re-seeding writes the four words into the
    generator's state (0.4 us; the ``state`` setter takes 1.3, a new ``default_rng`` 20,
    a 32x32 PNG decode 45 on this machine), or uses the setter where numpy lays the
    state out differently.
    """

    def __init__(self) -> None:
        self._bits = np.random.PCG64(0)
        self._generator = np.random.Generator(self._bits)
        self._memory = _state_words(self._bits)
        self._states = memoryview(b"").cast("Q")
        self._keys: tuple[list[int], list[int]] = ([], [])

    def keyed(self, seed: int, epoch: int, ids: np.ndarray) -> None:
        """Keys the generators of ``ids`` (``at(i)`` is then example ``ids[i]``'s)."""
        a, b = example_keys(seed, epoch, ids)
        if self._memory is None:
            self._keys = (a.tolist(), b.tolist())
            return
        states = np.empty((len(a), 4), np.uint64)
        states[:, 0], states[:, 1] = b, a
        states[:, 2] = (b << np.uint64(1)) | np.uint64(1)
        states[:, 3] = b >> np.uint64(63)
        self._states = states.reshape(-1).data.cast("B").cast("Q")

    def at(self, i: int) -> np.random.Generator:
        """The generator of the ``i``-th id given to ``keyed``, in its first state."""
        if self._memory is None:
            _set_state(self._bits, self._keys[0][i], self._keys[1][i])
        else:
            header, words = self._memory
            words[:] = self._states[4 * i : 4 * i + 4]
            header[1] = 0  # no buffered 32-bit half
        return self._generator

    def for_example(self, seed: int, epoch: int, example_id: int) -> np.random.Generator:
        self.keyed(seed, epoch, np.asarray([example_id]))
        return self.at(0)


_per_thread = threading.local()


def thread_rng() -> RecordRng:
    """This thread's ``RecordRng``: made once (65 us with cold caches, per chunk a
    measurable share of a worker's time), re-keyed for every chunk."""
    rng = getattr(_per_thread, "rng", None)
    if rng is None:
        rng = _per_thread.rng = RecordRng()
    return rng


def record_rng(seed: int, epoch: int, example_id: int) -> np.random.Generator:
    """A fresh generator in the state ``fn`` sees for this example."""
    return RecordRng().for_example(seed, epoch, example_id)
