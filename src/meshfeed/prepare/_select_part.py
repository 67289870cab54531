"""One part of a selection: a predicate over a run of a source's examples, kept ids out.

A source of ``n`` examples is cut into parts of consecutive ids, fixed by ``n`` alone
(``part_size``), so the same part holds the same examples whoever computes it and a
killed ``select`` run again redoes only the parts not written. The parts are also what
is handed out to processes, so they are small: about ``PARTS`` a source, between
``MIN_PART`` and ``PART`` examples each. With 4 parts of 65,536 for 200,000 examples a
process waited seconds for the other's last part; with ~64, the processes end within a
part of each other (under 2% of the work each), for ~0.3 ms a part of reads and files. A
part reads its examples about ``CHUNK_BYTES`` at a time (a call a chunk costs ~0.2 ms on
a memory map), calls the predicate on each record (a dict of the example's fields, as a
record transform gets), and writes the kept ids as ``parts/<index>.npy`` under the
selection's folder: to a temporary name first, then renamed, so a part file is whole or
absent. ``SelectRunner`` is the same work in a worker process (``_worker``) or a Ray
task; this module imports no JAX.
"""

from __future__ import annotations

import functools
import math
import os
import pickle
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from meshfeed.data._bad_records import error_line

PART = 1 << 16  # the most examples a part
MIN_PART = 1 << 13  # the fewest (a source of fewer examples is one part)
PARTS = 64  # parts a source is cut into, within those bounds
CHUNK_BYTES = 8 << 20  # a read: this many bytes of fixed-size fields, at least 64 examples


def _chunk(source: Any) -> int:
    """Examples a read: a whole part of small rows, fewer of large ones."""
    row = sum(
        math.prod(s.shape) * np.dtype(s.dtype).itemsize if not s.ragged else 1024
        for s in source.fields.values()
    )
    return max(64, min(1 << 16, CHUNK_BYTES // max(1, row)))


class KeepRaised(ValueError):
    """The predicate raised on an example; the message names it and the error."""


@functools.cache
def records(names: tuple[str, ...]) -> Callable[..., Iterator[dict[str, Any]]]:
    """``records(*columns)``: each row's record, a dict of the fields ``names``."""
    columns = ", ".join(f"c{k}" for k in range(len(names)))
    values = ", ".join(f"v{k}" for k in range(len(names)))
    literal = ", ".join(f"{name!r}: v{k}" for k, name in enumerate(names))
    return eval(f"lambda {columns}: ({{{literal}}} for {values}, in zip({columns}))")


@functools.cache
def kept_in(names: tuple[str, ...]) -> Callable[..., list[int]]:
    """``kept_in(keep, examples, *columns)``: the examples whose record ``keep`` keeps.

    Made for the fields ``names`` as one comprehension over the columns with the record
    a dict literal: on Python 3.11 a dict comprehension a record (a function call each)
    took 0.31 s for a million one-field records, twice the 0.15 s of the predicate's own
    calls in a plain loop; a generator of records 0.18 s; this about the loop's time.
    """
    columns = ", ".join(f"c{k}" for k in range(len(names)))
    values = ", ".join(f"v{k}" for k in range(len(names)))
    literal = ", ".join(f"{name!r}: v{k}" for k, name in enumerate(names))
    return eval(
        f"lambda keep, examples, {columns}: "
        f"[i for i, {values} in zip(examples, {columns}) if keep({{{literal}}})]"
    )


def part_size(n: int) -> int:
    """Examples a part of a source of ``n`` examples (``PARTS`` parts, each within
    ``MIN_PART`` and ``PART``): a function of ``n`` alone."""
    return min(PART, max(MIN_PART, -(-n // PARTS)))


def part_count(n: int) -> int:
    """The parts a source of ``n`` examples is cut into."""
    return -(-n // part_size(n))


def part_path(folder: str, index: int) -> str:
    """Where part ``index``'s kept ids are written."""
    return os.path.join(folder, "parts", f"{index:06d}.npy")


def keep_part(
    source: Any, keep: Callable[[dict[str, Any]], Any], index: int, folder: str, part: int
) -> dict[str, int]:
    """Runs ``keep`` over part ``index`` (of ``part`` examples a part: the caller's
    ``part_size``) of ``source`` and writes its kept ids; returns the part's examples
    and kept count. ``KeepRaised`` names an example ``keep`` raised on."""
    n = len(source)
    lo, hi = index * part, min(n, (index + 1) * part)
    kept: list[int] = []
    names = tuple(source.fields)
    chunk = _chunk(source)
    kept_of = kept_in(names)
    for start in range(lo, hi, chunk):
        ids = np.arange(start, min(hi, start + chunk))
        read = source[ids]
        columns = [
            v if isinstance(v, np.ndarray) else [v[i] for i in range(len(ids))]
            for v in (read[name] for name in source.fields)
        ]
        examples = range(start, start + len(ids))
        try:
            kept += kept_of(keep, examples, *columns)
        except Exception:
            _name_the_example(keep, examples, records(names)(*columns))
    path = part_path(folder, index)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "wb") as f:
        np.save(f, np.asarray(kept, np.int64))
    os.replace(temporary, path)
    return {"examples": hi - lo, "kept": len(kept)}


def _name_the_example(keep: Any, examples: range, records: Iterator[Any]) -> None:
    """Raises ``KeepRaised`` naming the first of ``examples`` that ``keep`` raises on
    (called again on each, once one of them raised)."""
    for example, record in zip(examples, records, strict=False):
        try:
            keep(record)
        except Exception as error:
            raise KeepRaised(
                f"the predicate raised on example {example} of the source: "
                f"{error_line(error)}\n{traceback.format_exc()}"
            ) from error
    raise KeepRaised(
        f"the predicate raised on one of examples {examples[0]}..{examples[-1]} of the "
        "source, and on none of them when called again one by one."
    )


class SelectRunner:
    """What a worker does for ``select``: the source and predicate opened once, then a
    part at a time (the ``_worker`` protocol: ``("done", index, counts)`` or
    ``("error", index, message)``)."""

    def __init__(self, init: dict[str, Any]) -> None:
        self.source = pickle.loads(init["source"])
        self.keep = pickle.loads(init["keep"])
        self.folder = init["folder"]
        self.part = init["part"]

    def __call__(self, index: int, progress: Any = None) -> tuple[Any, ...]:
        try:
            counts = keep_part(self.source, self.keep, index, self.folder, self.part)
        except KeepRaised as error:
            return ("error", index, str(error))
        except Exception as error:
            return ("error", index, f"{type(error).__name__}: {error}\n{traceback.format_exc()}")
        return ("done", index, counts)


_RUNNERS: dict[str, SelectRunner] = {}


def ray_select_part(init: dict[str, Any], index: int) -> tuple[Any, ...]:
    """One part, in a Ray task (a worker keeps its runner for the selection's next part)."""
    if init["folder"] not in _RUNNERS:
        _RUNNERS.clear()
        _RUNNERS[init["folder"]] = SelectRunner(init)
    return _RUNNERS[init["folder"]](index)
