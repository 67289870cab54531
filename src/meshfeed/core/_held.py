"""Host memory lent to arrays, and given back once nothing points at it any more.

A batch's rows reach the devices from host memory: the record workers' shared-memory
slots, or buffers the loading process fills. Copying them into a fresh array first
cost the loading process a memcpy and a page fault per 4 KiB every step, on one
thread. Handing the devices the memory itself is free, but the memory may only be
reused when nothing points at it any more -- and on the CPU backend a ``jax.Array``
placed from an aligned numpy array *is* that memory (XLA aliases it, for as long as the
array lives; a GPU's transfer reads it until the copy is done). So the memory is lent:
``lend`` makes numpy arrays over it whose base is one small holder object, and calls
``on_free`` once the holder is gone.

Why a holder and not a watch on the arrays: numpy collapses a view's base to the first
object that is not an array of the same type, so every view of the lent arrays (a
slice per device, JAX's own reference to what it placed, a user's view) keeps the
holder alive, and a weak reference to it fires only when the last of them is gone --
whoever took the views, whatever JAX does inside. The holder is a ``ctypes`` array
made ``from_buffer``: it also holds a buffer export on the mapping, so a block whose
rows are still lent cannot be unmapped under them (closing it raises ``BufferError``,
and ``workers._blocks.MappedBlock.close`` leaves the mapping to the lent rows: it is
unmapped when the last of them is gone).

``HostBuffers`` is the same for private memory: a few 64-byte aligned buffers per
shape, reused, for the rows that do not come out of a shared slot.
"""

from __future__ import annotations

import collections
import ctypes
import math
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

ALIGN = 64  # XLA:CPU aliases host memory aligned to 64 bytes; pages are aligned further
Field = tuple[str, tuple[int, ...], Any, int]  # name, shape, dtype, byte offset
Fields = Sequence[Field]


def lend(buffer: Any, fields: Fields, on_free: Callable[[], None]) -> dict[str, np.ndarray]:
    """Arrays over ``buffer`` (writable; one per field, at its offset) that call
    ``on_free()`` once neither they nor any view of them is left.

    ``on_free`` runs on whichever thread drops the last view (JAX's, a user's, or the
    garbage collector's): it must be quick and take no lock that thread might hold.
    """
    end = max(
        (at + math.prod(shape) * np.dtype(dtype).itemsize for _, shape, dtype, at in fields),
        default=0,
    )
    holder: Any = (ctypes.c_char * max(1, end)).from_buffer(buffer)  # exports a buffer
    finalizer = weakref.finalize(holder, on_free)
    finalizer.atexit = False  # at exit nothing is reused
    return {
        name: np.ndarray(shape, dtype, buffer=holder, offset=at)
        for name, shape, dtype, at in fields
    }


def layout(spec: Mapping[str, Any], rows: int) -> tuple[list[Field], int]:
    """Each field of ``spec`` (name -> ``FieldSpec``-like, with ``shape`` and ``dtype``)
    at its offset in a buffer of ``rows`` rows, every field 64-byte aligned; and the
    buffer's size."""
    out: list[Field] = []
    at = 0
    for name, s in spec.items():
        shape = (rows, *s.shape)
        out.append((name, shape, np.dtype(s.dtype), at))
        at += -(-(math.prod(shape) * np.dtype(s.dtype).itemsize) // ALIGN) * ALIGN
    return out, at


def aligned_empty(nbytes: int) -> np.ndarray:
    """``nbytes`` of uninitialised host memory starting on a 64-byte boundary."""
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start : start + nbytes]


class HostBuffers:
    """Aligned host buffers for batch rows, reused once their arrays are gone.

    ``take(spec, rows)`` gives arrays for ``rows`` rows of each field (uninitialised),
    over a buffer that comes back to this pool when no array points at it. At most
    ``keep`` free buffers are kept per shape; past ``most_lent`` buffers out at once (a
    caller that keeps its batches) it hands out plain arrays instead, so a pool never
    holds more than a few batches' memory of its own.
    """

    def __init__(self, *, keep: int = 4, most_lent: int = 16) -> None:
        self._keep = keep
        self._most_lent = most_lent
        self._free: dict[tuple[Any, ...], list[np.ndarray]] = {}
        self._back: collections.deque[tuple[tuple[Any, ...], np.ndarray]] = collections.deque()
        self._lock = threading.Lock()
        self._lent = 0  # buffers lent, some perhaps back in ``_back`` already

    def take(self, spec: Mapping[str, Any], rows: int) -> dict[str, np.ndarray]:
        """Arrays for ``rows`` rows of every field of ``spec`` (contents undefined)."""
        fields, size = layout(spec, rows)
        key = (tuple((n, s, str(d)) for n, s, d, _ in fields), size)
        with self._lock:
            self._take_back()
            free = self._free.setdefault(key, [])
            if not free and self._lent >= self._most_lent:
                return {name: np.empty(shape, dtype) for name, shape, dtype, _ in fields}
            buffer = free.pop() if free else aligned_empty(size)
            self._lent += 1
        back = self._back

        def on_free() -> None:  # any thread; deque.append is atomic, no lock needed
            back.append((key, buffer))

        return lend(buffer, fields, on_free)

    @property
    def lent(self) -> int:
        """Buffers out now, their arrays alive."""
        return self._lent - len(self._back)

    def _take_back(self) -> None:
        while self._back:
            key, buffer = self._back.popleft()
            self._lent -= 1
            free = self._free.setdefault(key, [])
            if len(free) < self._keep:
                free.append(buffer)
