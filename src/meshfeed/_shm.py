"""Shared-memory slots: blocks that worker processes write a batch's output rows into.

A slot holds one batch's rows of every field, each field's block 64-byte aligned; the
main process creates the blocks, hands their names to the workers, copies finished rows
out before a slot is reused (JAX may keep referencing host memory it was handed), and
unlinks every block on close, on error and at exit. Workers map a block by name without
registering it for cleanup, so only the process that created it ever unlinks it; if
that process is killed, Python's resource tracker unlinks it.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
from collections.abc import Callable, Mapping
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from meshfeed._sources import FieldSpec

Spec = Mapping[str, FieldSpec]


def offsets(spec: Spec, rows: int) -> dict[str, tuple[int, int]]:
    """Byte offset and size of each field's block in a slot of ``rows`` rows."""
    out, at = {}, 0
    for name, s in spec.items():
        size = rows * math.prod(s.shape) * np.dtype(s.dtype).itemsize
        out[name] = (at, size)
        at += -(-size // 64) * 64  # keep every field 64-byte aligned
    return out


def views(buffer: Any, spec: Spec, rows: int) -> dict[str, np.ndarray]:
    """Each field's rows, as arrays over ``buffer`` (no copy)."""
    at = offsets(spec, rows)
    return {
        name: np.ndarray((rows, *s.shape), s.dtype, buffer=buffer, offset=at[name][0])
        for name, s in spec.items()
    }


def attach(name: str) -> tuple[Any, Callable[[], None]]:
    """Maps an existing block without registering it for cleanup in this process."""
    try:  # Python 3.13+
        shm = shared_memory.SharedMemory(name=name, track=False)  # type: ignore[call-arg]
        return shm.buf, shm.close
    except TypeError:
        pass
    path = os.path.join("/dev/shm", name.lstrip("/"))
    fd = os.open(path, os.O_RDWR)
    try:
        mapped = mmap.mmap(fd, 0)
    finally:
        os.close(fd)
    return mapped, mapped.close


def unlink_all(blocks: list[shared_memory.SharedMemory]) -> None:
    """Unlinks and closes ``blocks`` (safe on blocks already gone)."""
    for shm in list(blocks):
        # Unlink first: it frees the name even if a view still pins the mapping.
        with contextlib.suppress(FileNotFoundError):
            shm.unlink()
        with contextlib.suppress(BufferError):
            shm.close()
    blocks.clear()


class Slots:
    """Shared-memory slots for batches of one shape, created as needed and reused.

    ``blocks`` is the list of blocks this process created; whoever owns the slots
    passes it to its finaliser, so they are unlinked even if ``close`` never runs.
    """

    def __init__(self) -> None:
        self.blocks: list[shared_memory.SharedMemory] = []
        self._free: list[int] = []
        self._key: tuple[Any, ...] | None = None

    def take(self, spec: Spec, rows: int) -> int:
        """A free slot for ``rows`` rows of ``spec`` (a new block if none is free)."""
        key = (tuple(spec.items()), rows)
        if self._key != key:
            if len(self._free) != len(self.blocks):
                raise RuntimeError("record outputs changed shape while batches were in flight.")
            self.close()
            self._key = key
        if not self._free:
            at, size = list(offsets(spec, rows).values())[-1]
            self.blocks.append(shared_memory.SharedMemory(create=True, size=max(1, at + size)))
            self._free.append(len(self.blocks) - 1)
        return self._free.pop()

    def name(self, slot: int) -> str:
        return self.blocks[slot].name

    def copy_out(self, slot: int, spec: Spec, rows: int) -> dict[str, np.ndarray]:
        """Copies of the rows in ``slot`` (before the slot can be reused)."""
        held = views(self.blocks[slot].buf, spec, rows)
        out = {k: np.array(v) for k, v in held.items()}
        del held  # no view may outlive the block
        return out

    def give_back(self, slot: int) -> None:
        self._free.append(slot)

    def close(self) -> None:
        """Unlinks every block."""
        unlink_all(self.blocks)
        self._free.clear()
