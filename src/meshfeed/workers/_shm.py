"""Shared memory between the loading process and its workers.

``Slots`` hold batches' output rows: a slot holds one batch's rows of every field, each
field's block 64-byte aligned. ``Inputs`` hold the rows the workers read, in blocks
reused by size, written by ``put_rows`` and read by ``get_rows`` without pickle where it
can be helped: numeric fields as their bytes, fields of ``bytes`` (encoded images,
records) as one run of bytes plus their lengths, anything else pickled. The main
process creates every block (where ``_blocks`` says: /dev/shm, or files), hands their
names to the workers, copies finished rows out before a slot is reused (JAX may keep
referencing host memory it was handed), and unlinks every block on close, on error and
at exit. Workers map a block by name without registering it for cleanup (``Attached``),
so only the process that created it ever unlinks it; if that process is killed,
Python's resource tracker unlinks its /dev/shm blocks and the workers its files.
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
import pickle
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from meshfeed.data._sources import FieldSpec
from meshfeed.workers._blocks import Block, Transport, attach, is_file_block

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


def unlink_all(blocks: list[Block]) -> None:
    """Unlinks and closes ``blocks`` (safe on blocks already gone)."""
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

    ``blocks`` is the list of blocks this process created; whoever owns the slots
    passes it to its finaliser, so they are unlinked even if ``close`` never runs.
    """

    def __init__(self, create: Callable[[int], Block]) -> None:
        self._create = create
        self.blocks: list[Block] = []
        self._free: dict[tuple[Any, ...], list[int]] = {}

    def take(self, spec: Spec, rows: int) -> int:
        """A free slot for ``rows`` rows of ``spec`` (a new block if none is free)."""
        free = self._free.setdefault((tuple(spec.items()), rows), [])
        if free:
            return free.pop()
        self.blocks.append(self._create(slot_bytes(spec, rows)))
        return len(self.blocks) - 1

    def name(self, slot: int) -> str:
        return self.blocks[slot].name

    def copy_out(self, slot: int, spec: Spec, rows: int) -> dict[str, np.ndarray]:
        """Copies of the rows in ``slot`` (before the slot can be reused)."""
        held = views(self.blocks[slot].buf, spec, rows)
        out = {k: np.array(v) for k, v in held.items()}
        del held  # no view may outlive the block
        return out

    def give_back(self, slot: int, spec: Spec, rows: int) -> None:
        self._free[(tuple(spec.items()), rows)].append(slot)

    def close(self) -> None:
        """Unlinks every block."""
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
    at, size = list(offsets(spec, rows).values())[-1]
    return at + size


class PoolBlocks:
    """Every block of one pool: each worker's status cell, the output slots, the input
    blocks, made where the ``Transport`` says (/dev/shm, or files).

    ``plan`` runs once, with the first rows: ``read_ahead`` is the most steps and bytes
    the loader's read-ahead may hold, and ``steps_ahead`` what /dev/shm allows of it
    (``None``: all).
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
        self.steps_ahead = self.transport.plan(out + input_block_bytes(input_bytes), wanted)

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
