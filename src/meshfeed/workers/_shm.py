"""Shared memory between the loading process and its workers.

``Slots`` hold batches' output rows: a slot holds one batch's rows of every field, each
field's block 64-byte aligned. ``Inputs`` hold the rows the workers read, in blocks
reused by size (laid out by ``_layouts``), and ``PoolBlocks.share`` an in-memory
source's copy the workers read themselves (``_shared_rows``). The main process
creates every block (where ``_blocks`` says: /dev/shm, or files), hands their names to
the workers, lends finished rows out of their slot (``Slots.lend``: the arrays handed to
JAX are the slot's memory, and the slot is reused only once no array points at it), and
unlinks every block on close, on error and at exit. Workers map a block by name
without registering it for cleanup (``Attached``), so only the process that created it
ever unlinks it; if that process is killed, Python's resource tracker unlinks its
/dev/shm blocks and the workers its files.
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from meshfeed.core._held import layout, lend
from meshfeed.workers._blocks import (
    Block,
    MappedBlock,
    Transport,
    attach,
    is_file_block,
    shm_block,
    shm_free,
)
from meshfeed.workers._layouts import IDS, Layout, Spec, Staged, stage, staged_spec
from meshfeed.workers._shared_rows import SharedRows, fits
from meshfeed.workers._shared_rows import size as shared_size

MOST_LENT = 4
"""Slots whose rows may be out at once: the batch in the loop, those the devices still
read (a training loop dispatches a step or two ahead), and one spare."""


def views(buffer: Any, spec: Spec, rows: int) -> dict[str, np.ndarray]:
    """Each field's rows, as arrays over ``buffer`` (no copy)."""
    fields, _ = layout(spec, rows)
    return {
        name: np.ndarray(shape, dtype, buffer=buffer, offset=at)
        for name, shape, dtype, at in fields
    }


def unlink_all(blocks: list[Block]) -> None:
    """Unlinks and closes ``blocks`` (safe on blocks already gone; a block whose rows
    are lent stays mapped until they are all gone)."""
    for shm in list(blocks):
        # Unlink first: it frees the name even if a view still pins the mapping.
        with contextlib.suppress(FileNotFoundError):
            shm.unlink()
        with contextlib.suppress(BufferError):
            shm.close()
    blocks.clear()


class Slots:
    """Shared-memory slots for batches, created as needed (by ``create``) and reused for
    the same shape.

    A slot's rows leave it lent (``lend``): the arrays handed out are the slot's memory,
    and the slot is reused only once no array points at it any more (``core._held``):
    not the loader's, not JAX's (on the CPU a placed array *is* that memory; a GPU
    reads it until its copy is done), not a user's view. At most ``most_lent`` slots
    are out at once; past that (a caller that keeps its batches) rows are copied out,
    and the slot is free at once. ``blocks`` is the list of blocks this process
    created; whoever owns the slots passes it to its finaliser, so they are unlinked
    even if ``close`` never runs.
    """

    def __init__(self, create: Callable[[int], Block], most_lent: int = 0) -> None:
        self._create = create
        self.most_lent = most_lent
        self.blocks: list[Block] = []
        self._free: dict[tuple[Any, ...], list[int]] = {}
        self._back: collections.deque[tuple[tuple[Any, ...], int]] = collections.deque()
        self._lent = 0  # slots lent, some perhaps back in ``_back`` already

    def take(self, spec: Spec, rows: int) -> int:
        """A free slot for ``rows`` rows of ``spec`` (a new block if none is free)."""
        self._take_back()
        free = self._free.setdefault((tuple(spec.items()), rows), [])
        if free:
            return free.pop()
        self.blocks.append(self._create(slot_bytes(spec, rows)))
        return len(self.blocks) - 1

    def _take_back(self) -> None:
        while self._back:
            key, slot = self._back.popleft()
            self._lent -= 1
            self._free[key].append(slot)

    def name(self, slot: int) -> str:
        return self.blocks[slot].name

    def may_lend(self, slot: int) -> bool:
        """Whether the rows in ``slot`` may be lent (counted as lent if so): a block
        that ``lend`` can hold (a ``MappedBlock``), and fewer than ``most_lent`` out."""
        self._take_back()
        if not isinstance(self.blocks[slot], MappedBlock) or self._lent >= self.most_lent:
            return False
        self._lent += 1
        return True

    @property
    def lent(self) -> int:
        """Slots whose rows are out now."""
        return self._lent - len(self._back)

    def lend(self, slot: int, spec: Spec, rows: int) -> dict[str, np.ndarray]:
        """The rows in ``slot``, as arrays over it: the slot is reused once no array
        (nor any view of one) is left. Only after ``may_lend`` said yes."""
        key = (tuple(spec.items()), rows)
        back = self._back

        def on_free() -> None:  # any thread, perhaps one that holds the pool's lock
            back.append((key, slot))

        buffer = self.blocks[slot].buf
        assert buffer is not None
        return lend(buffer, layout(spec, rows)[0], on_free)

    def copy_out(self, slot: int, spec: Spec, rows: int) -> dict[str, np.ndarray]:
        """Copies of the rows in ``slot`` (before the slot can be reused)."""
        held = views(self.blocks[slot].buf, spec, rows)
        out = {k: np.array(v) for k, v in held.items()}
        del held  # no view may outlive the block
        return out

    def give_back(self, slot: int, spec: Spec, rows: int) -> None:
        self._free[(tuple(spec.items()), rows)].append(slot)

    def close(self) -> None:
        """Unlinks every block (those with rows lent stay mapped until they come back)."""
        unlink_all(self.blocks)
        self._free.clear()


class Inputs:
    """Blocks for the bytes workers read, reused by size (a new one, a power of two of at
    least 64 KiB, when no free block is large enough)."""

    def __init__(self, create: Callable[[int], Block]) -> None:
        self._create = create
        self.blocks: list[Block] = []
        self._free: list[int] = []

    def take(self, size: int) -> int:
        fits = [i for i in self._free if self.blocks[i].size >= size]
        if fits:
            best = min(fits, key=lambda i: self.blocks[i].size)
            self._free.remove(best)
            return best
        self.blocks.append(self._create(input_block_bytes(size)))
        return len(self.blocks) - 1

    def buffer(self, block: int) -> Any:
        return self.blocks[block].buf

    def name(self, block: int) -> str:
        return self.blocks[block].name

    def give_back(self, block: int) -> None:
        self._free.append(block)

    def close(self) -> None:
        unlink_all(self.blocks)
        self._free.clear()


def input_block_bytes(size: int) -> int:
    """The size of the input block made for ``size`` bytes of rows."""
    return max(1 << 16, 1 << (max(size, 1) - 1).bit_length())


def slot_bytes(spec: Spec, rows: int) -> int:
    """The size of the slot of ``rows`` output rows of ``spec``."""
    return layout(spec, rows)[1]


class PoolBlocks:
    """Every block of one pool: each worker's status cell, the output slots, the input
    blocks, made where the ``Transport`` says (/dev/shm, or files).

    ``plan`` runs once, with the first rows: ``read_ahead`` is the most steps and bytes
    the loader's read-ahead may hold, ``steps_ahead`` what /dev/shm allows of it
    (``None``: all), and ``slots.most_lent`` how many slots' rows may be out lent
    beside it (``MOST_LENT``, fewer where /dev/shm is short).
    """

    def __init__(self, status_bytes: int, read_ahead: tuple[int, int]) -> None:
        self.transport = Transport()
        self.status = self.transport.create(status_bytes)  # each worker's example in hand
        self.status.buf[:status_bytes] = b"\xff" * status_bytes  # -1: none
        self.slots, self.inputs = Slots(self.transport.create), Inputs(self.transport.create)
        self.steps_ahead: int | None = None
        self._read_ahead: tuple[int, int] | None = read_ahead
        self.shared: SharedRows | None = None

    def share(self, arrays: Mapping[str, np.ndarray]) -> SharedRows | None:
        """The source's ``arrays`` copied into a /dev/shm block for the workers to read
        (``_shared_rows``), where they fit; else ``None`` (input blocks, as before)."""
        nbytes = shared_size(arrays)
        if self.transport.kind != "shm" or not fits(nbytes, shm_free()):
            return None
        try:
            block = shm_block(nbytes)
        except OSError:  # another process took the room meanwhile: input blocks
            return None
        self.shared = SharedRows(block, arrays)
        return self.shared

    def plan(self, spec: Spec, rows: int, input_bytes: int) -> None:
        """Plans for steps of ``rows`` output rows and ``input_bytes`` of input (once)."""
        if self._read_ahead is None:
            return
        steps, most = self._read_ahead
        self._read_ahead = None
        out = slot_bytes(spec, rows)
        wanted = min(steps, max(1, most // max(1, out)))
        step_bytes = out + input_block_bytes(input_bytes)
        self.steps_ahead, self.slots.most_lent = self.transport.plan(step_bytes, wanted, MOST_LENT)

    def stage(self, fields: Spec, rows: int) -> Staged:
        """An input block for ``rows`` rows of ``fields``, as arrays to read into."""
        block = self.inputs.take(layout(staged_spec(fields), rows)[1])
        return stage(self.inputs.buffer(block), block, fields, rows)

    def input_name(self, block: int | None) -> str:
        """The name of input block ``block`` (``None``: the shared source's copy)."""
        if block is None:
            assert self.shared is not None
            return self.shared.name
        return self.inputs.name(block)

    def input_bytes(self, staged: Staged | None) -> int:
        """The size of a staged block (``None``: the shared source's rows, none)."""
        return 0 if staged is None else self.inputs.blocks[staged.block].size

    def chunk(self, staged: Staged | None, ids: np.ndarray, lo: int, hi: int) -> Layout:
        """The layout of rows ``[lo, hi)``: in ``staged``, or (``None``) in the shared copy."""
        if staged is not None:
            return staged.chunk(lo, hi)
        assert self.shared is not None
        return self.shared.chunk(ids[lo:hi], IDS)

    def give_back(self, slot: int | None, spec: Spec, rows: int, block: int | None) -> None:
        """Gives back a batch's output ``slot`` (``None``: lent, back by itself) and
        input ``block`` (``None``: it had none)."""
        if slot is not None:
            self.slots.give_back(slot, spec, rows)
        if block is not None:
            self.inputs.give_back(block)

    def example_in_hand(self, worker: int, stride: int) -> int:
        """The example a worker's status cell names (-1: none, or the blocks are closed)."""
        buffer = self.status.buf
        if buffer is None:
            return -1
        return int.from_bytes(buffer[stride * worker :][:8], sys.byteorder, signed=True)

    def close(self) -> None:
        """Unlinks every block and removes the files' folder, if any."""
        shared = [] if self.shared is None else [self.shared.block]
        for blocks in (self.slots.blocks, self.inputs.blocks, [self.status], shared):
            unlink_all(blocks)
        self.transport.close()


class Attached:
    """A worker's maps of the blocks it was named, the ``size`` most recent kept.

    An evicted map is dropped, not closed: numpy arrays over a map keep no buffer
    export, so closing it under one would leave the array pointing at unmapped memory;
    a dropped map is unmapped when the last array over it goes.
    """

    def __init__(self, size: int = 64) -> None:
        self._maps: collections.OrderedDict[str, tuple[Any, Callable[[], None]]] = (
            collections.OrderedDict()
        )
        self._size = size

    def __getitem__(self, name: str) -> Any:
        if name in self._maps:
            self._maps.move_to_end(name)
        else:
            self._maps[name] = attach(name)
            if len(self._maps) > self._size:
                self._maps.popitem(last=False)
        return self._maps[name][0]

    def folders(self) -> set[str]:
        """The folders of the file blocks mapped (the files transport's)."""
        return {os.path.dirname(name) for name in self._maps if is_file_block(name)}

    def close(self) -> None:
        self._maps.clear()
