"""Shared memory between the loading process and its workers.

``Slots`` hold batches' output rows: a slot holds one batch's rows of every field, each
field's block 64-byte aligned. ``Inputs`` hold the rows the workers read, in blocks
reused by size, written by ``put_rows`` and read by ``get_rows`` without pickle where it
can be helped: numeric fields as their bytes, fields of ``bytes`` (encoded images,
records) as one run of bytes plus their lengths, anything else pickled. The main process
creates every block (where ``_blocks`` says: /dev/shm, or files), hands their names to
the workers, lends finished rows out of their slot (``Slots.lend``: the arrays handed to
JAX are the slot's memory, and the slot is reused only once no array points at it), and
unlinks every block on close, on error and at exit. ``stage`` gives arrays over an input
block for a source to read a step's rows straight into. Workers map a block by name
without registering it for cleanup (``Attached``), so only the process that created it
ever unlinks it; if that process is killed, Python's resource tracker unlinks its
/dev/shm blocks and the workers its files.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import os
import pickle
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from meshfeed.core._held import layout, lend
from meshfeed.data._sources import FieldSpec
from meshfeed.workers._blocks import Block, MappedBlock, Transport, attach, is_file_block

Spec = Mapping[str, FieldSpec]
IDS = "__meshfeed_ids__"  # a chunk's example ids, beside its fields in the input block
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
        key, back = (tuple(spec.items()), rows), self._back

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

    def example_in_hand(self, worker: int, stride: int) -> int:
        """The example a worker's status cell names (-1: none, or the blocks are closed)."""
        buffer = self.status.buf
        if buffer is None:
            return -1
        return int.from_bytes(buffer[stride * worker :][:8], sys.byteorder, signed=True)

    def close(self) -> None:
        """Unlinks every block and removes the files' folder, if any."""
        for blocks in (self.slots.blocks, self.inputs.blocks, [self.status]):
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


Layout = list[tuple[Any, ...]]  # how put_rows laid out a chunk's fields in a block
Prepared = list[tuple[str, str, Any]]  # (field, kind, what to write)


def prepare_rows(part: Mapping[str, Any]) -> tuple[Prepared, int]:
    """What ``put_rows`` writes for ``part``, and the bytes it takes (alignment included)."""
    prepared: Prepared = []
    size = 0
    for name, column in part.items():
        if isinstance(column, np.ndarray) and column.dtype != object:
            column = np.ascontiguousarray(column)
            prepared.append((name, "array", column))
            size += column.nbytes
        elif isinstance(column, np.ndarray) and set(map(type, column)) <= {bytes}:
            lengths = np.fromiter(map(len, column), np.int64, len(column))
            data = b"".join(column)
            prepared.append((name, "bytes", (lengths, data)))
            size += lengths.nbytes + len(data)
        else:  # a Ragged, objects of other kinds
            blob = pickle.dumps(column, protocol=5)
            prepared.append((name, "pickle", blob))
            size += len(blob)
        size += 64
    return prepared, size


def _aligned(at: int) -> int:
    return -(-at // 64) * 64


def put_rows(buffer: Any, at: int, prepared: Prepared) -> tuple[Layout, int]:
    """Writes prepared fields into ``buffer`` from ``at``; returns the layout and the end."""
    layout: Layout = []
    for name, kind, value in prepared:
        at = _aligned(at)
        if kind == "array":
            np.ndarray(value.shape, value.dtype, buffer=buffer, offset=at)[...] = value
            layout.append((kind, name, value.dtype.str, value.shape, at))
            at += value.nbytes
        elif kind == "bytes":
            lengths, data = value
            np.ndarray(lengths.shape, np.int64, buffer=buffer, offset=at)[...] = lengths
            start = at + lengths.nbytes
            buffer[start : start + len(data)] = data
            layout.append((kind, name, len(lengths), at))
            at = start + len(data)
        else:
            buffer[at : at + len(value)] = value
            layout.append((kind, name, len(value), at))
            at += len(value)
    return layout, at


def get_rows(buffer: Any, layout: Layout) -> dict[str, np.ndarray]:
    """The fields ``put_rows`` wrote (numeric ones as views of ``buffer``)."""
    out: dict[str, np.ndarray] = {}
    for kind, name, *rest in layout:
        if kind == "array":
            dtype, shape, at = rest
            out[name] = np.ndarray(shape, np.dtype(dtype), buffer=buffer, offset=at)
        elif kind == "bytes":
            count, at = rest
            ends = np.ndarray((count,), np.int64, buffer=buffer, offset=at).cumsum().tolist()
            start = at + 8 * count
            data = bytes(buffer[start : start + (ends[-1] if count else 0)])
            column = np.empty(count, object)
            column[:] = [data[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]
            out[name] = column
        else:
            size, at = rest
            out[name] = pickle.loads(buffer[at : at + size])
    return out


@dataclasses.dataclass
class Staged:
    """An input block a step's rows are read straight into (``stage``): each field's
    rows as arrays over it, the ids' place, and where each field starts."""

    block: int
    rows: dict[str, np.ndarray]
    ids: np.ndarray
    starts: list[tuple[str, np.dtype, tuple[int, ...], int]]  # name, dtype, row shape, at

    def chunk(self, lo: int, hi: int) -> Layout:
        """The layout of rows ``[lo, hi)`` in the block (``get_rows`` reads it)."""
        rows = hi - lo
        return [
            ("array", name, dtype.str, (rows, *shape), at + lo * math.prod(shape) * dtype.itemsize)
            for name, dtype, shape, at in self.starts
        ]


def staged_spec(fields: Spec) -> dict[str, FieldSpec]:
    """The fields of a staged block: the source's, and the ids."""
    return {**fields, IDS: FieldSpec((), np.dtype(np.int64))}


def stage(buffer: Any, block: int, fields: Spec, rows: int) -> Staged:
    """Arrays over ``buffer`` (input block ``block``) for ``rows`` rows of ``fields`` and
    their ids. They hold the block's mapping (``core._held.lend``): a pool closed while
    a read into them is under way leaves the memory to them instead of unmapping it."""
    at, _ = layout(staged_spec(fields), rows)
    arrays = lend(buffer, at, lambda: None)
    ids = arrays.pop(IDS)
    return Staged(block, arrays, ids, [(name, dtype, shape[1:], o) for name, shape, dtype, o in at])
