"""Sources: random access to examples by integer ids.

A source is anything with ``__len__``, ``__getitem__(ids) -> {field: array}`` and a
``fields`` mapping that tells each field's per-example shape and dtype without reading
data. The loader asks a source only for the ids its process needs, in one call per step,
so a source's job is a fast vectorised gather; everything about order, batching and
devices lives above it.

A field is fixed-shape (a numpy array per batch, ``FieldSpec.shape`` the per-example
shape) or ragged (a ``Ragged`` per batch, ``FieldSpec.shape`` ``(None, ...)``: documents
of any length). A source with ragged fields may also offer ``lengths(field)``, every
document's length read from offsets rather than values; ``meshfeed.pack`` plans with it.

The helpers below are what every source built from parts (shards, row groups, the
sources of a mixture) needs: the ids' range check, and a gather that reads each part
once per call and puts its rows where they belong.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from meshfeed.data._ragged import Ragged, assemble, is_ragged_shape


class FieldSpec(NamedTuple):
    """Per-example shape and dtype of one field; a ragged field's shape starts with None."""

    shape: tuple[Any, ...]  # ints; a ragged field's first entry is None
    dtype: np.dtype

    @property
    def ragged(self) -> bool:
        """Documents of any length (``shape`` ``(None, ...)``): a ``Ragged`` per batch."""
        return is_ragged_shape(self.shape)


def field_text(spec: FieldSpec) -> str:
    """``uint8[28, 28]`` (``int32[*]`` for a ragged field), for messages."""
    dims = ", ".join("*" if d is None else str(d) for d in spec.shape)
    return f"{np.dtype(spec.dtype)}[{dims}]"


def fields_text(fields: Mapping[str, FieldSpec]) -> str:
    """``image: uint8[28, 28], label: int32[]``, for reprs and messages."""
    return ", ".join(f"{name}: {field_text(spec)}" for name, spec in fields.items())


def describe(fields: Mapping[str, FieldSpec]) -> str:
    """``{image: uint8[28, 28], label: int32[]}``, for messages."""
    return "{" + fields_text(fields) + "}"


Column = np.ndarray | Ragged
"""One field's values for a batch of ids: an array with a row per id, or ``Ragged``."""


@runtime_checkable
class Source(Protocol):
    """Random access to examples by integer ids.

    ``source[ids]`` takes a 1-D ``int64`` array of ids in ``[0, len(source))`` (in any
    order, possibly repeated) and returns one array per field whose first dimension
    follows ``ids`` (a ``Ragged`` for a ragged field).

    The loader reads several steps at once, so ``source[ids]`` may be called from
    several threads together (as Grain's data sources are). A source that cannot take
    that sets a class attribute ``thread_safe = False``, and is then read one call at a
    time.
    """

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        """Each field's shape and dtype (per example), by name."""
        ...

    def __len__(self) -> int:
        """The number of examples; ids run over ``[0, len(source))``."""
        ...

    def __getitem__(self, ids: np.ndarray) -> Mapping[str, Column]:
        """The examples ``ids``: one array (or ``Ragged``) per field, a row per id."""
        ...


@runtime_checkable
class Origins(Protocol):
    """A source that can say where each example comes from, for messages.

    A record transform's error then names the example's file beside its id
    (``record_transform raised on example 17 (/data/train/cat/b.jpg) ...``), whatever
    worker ran it; a source without ``origin`` is named by id alone.
    """

    def origin(self, index: int) -> str:
        """Where example ``index`` comes from: its file, and the place in it (a path, a
        URL; for a file of many examples, the file and the example's place there)."""
        ...


@runtime_checkable
class PartialRows(Protocol):
    """A source of token rows that reads only some positions of each row.

    Its *sequence fields* have shape ``[T, ...]``, dimension 0 the row's tokens (``T``
    the row length); ``read_at(ids, at)`` reads rows ``ids`` with each of them cut to the
    positions ``at`` along ``T`` -- ``source[ids][f][:, at]``, the same values -- and
    every other field whole. With ``strategy="per_device"`` a device whose sharding
    splits those fields' dimension 1 (a context axis) reads only its own slice of each
    row through it (``meshfeed.sources.context_layout`` is such a source).
    """

    @property
    def sequence_fields(self) -> tuple[str, ...]:
        """The fields of shape ``[T, ...]`` that ``read_at`` cuts along ``T``."""
        ...

    def read_at(self, ids: np.ndarray, at: np.ndarray) -> Mapping[str, Column]:
        """Rows ``ids``, each sequence field cut to positions ``at`` (``[len(ids),
        len(at), ...]``), the other fields whole."""
        ...


@runtime_checkable
class BalancedSteps(Protocol):
    """A source that serves its rows in steps of even cost (``meshfeed.pack(...,
    balance=, step_rows=G)``): each run of ``step_rows`` rows, from a multiple of it,
    is one step's. A loader takes a run a step, the runs in a keyed shuffled order, and
    deals each step's rows to the data-parallel devices by ``row_costs``.
    """

    @property
    def step_rows(self) -> int | None:
        """Rows a step takes (``None``: the rows make no steps)."""
        ...

    def row_costs(self, ids: np.ndarray) -> np.ndarray:
        """The cost of rows ``ids`` (``float64``), as the attention kernel sees it."""
        ...


def check_positions(at: object, length: int, name: str) -> np.ndarray:
    """``at`` as 1-D ``int64``; raises ``IndexError`` unless every position is in
    ``[0, length)``."""
    out = np.asarray(at, dtype=np.int64)
    if out.ndim != 1:
        raise IndexError(f"positions must be a 1-D array for {name}; got shape {out.shape}.")
    if len(out) and (out.min() < 0 or out.max() >= length):
        raise IndexError(f"positions must be in [0, {length}) for {name} (rows of {length}).")
    return out


def document_lengths(source: Source, field: str, *, chunk: int = 65_536) -> np.ndarray:
    """Every document's length in ``field``: ``source.lengths(field)`` where the source
    offers it (from offsets), else the documents read ``chunk`` at a time and measured."""
    lengths = getattr(source, "lengths", None)
    if callable(lengths):
        return np.asarray(lengths(field))
    parts = []
    for a in range(0, len(source), chunk):
        values = source[np.arange(a, min(len(source), a + chunk))][field]
        parts.append(values.lengths if isinstance(values, Ragged) else [len(v) for v in values])
    return np.concatenate(parts).astype(np.int64)


def example_at(source: Source, index: int | np.integer) -> dict[str, Any]:
    """``source[i]`` for an int ``i`` (negative counts from the end): the example,
    each field's one row of ``source[np.array([i])]`` (a ragged field's document as an
    array). What every built-in source's ``__getitem__`` gives for an int."""
    if isinstance(index, bool):
        raise TypeError(f"source[{index!r}]: pass an int index or an array of ids.")
    n = len(source)
    i = int(index)
    if not -n <= i < n:
        raise IndexError(f"example {i} is out of range for a source of {n} examples.")
    rows = source[np.array([i % n], np.int64)]
    return {name: column[0] for name, column in rows.items()}


def check_ids(ids: object, n: int, name: str) -> np.ndarray:
    """``ids`` as ``int64``; raises ``IndexError`` unless every id is in ``[0, n)``."""
    out = np.asarray(ids, dtype=np.int64)
    if len(out) and (out.min() < 0 or out.max() >= n):
        raise IndexError(f"ids must be in [0, {n}) for {name}.")
    return out


def locate(starts: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(part, id within the part) of each id, for parts starting at ``starts``.

    ``starts`` is ascending and begins with 0 (a cumulative sum of part lengths).
    """
    part = np.searchsorted(starts, ids, side="right") - 1
    return part, ids - starts[part]


def gather_by_part(
    part: np.ndarray,
    local: np.ndarray,
    fields: Mapping[str, FieldSpec],
    read: Callable[[int, np.ndarray], Mapping[str, Column]],
) -> dict[str, Column]:
    """Rows from several parts, in the order asked for.

    Row ``i`` is row ``local[i]`` of part ``part[i]``; ``read(p, local_ids)`` reads the
    rows of part ``p``, called once per part that holds any.
    """
    out: dict[str, Any] = {
        k: np.empty((len(part), *s.shape), s.dtype) for k, s in fields.items() if not s.ragged
    }
    pieces: dict[str, list[tuple[np.ndarray, Ragged]]] = {
        k: [] for k, s in fields.items() if s.ragged
    }
    for p in np.unique(part).tolist():
        where = np.flatnonzero(part == p)
        for name, values in read(p, local[where]).items():
            if name in pieces:
                pieces[name].append((where, values))  # type: ignore[arg-type]  # a Ragged
            else:
                out[name][where] = values
    for name, parts in pieces.items():
        out[name] = assemble(len(part), parts, fields[name].dtype)
    return {name: out[name] for name in fields}  # in the source's order


def thread_safe(source: object) -> bool:
    """Whether ``source[ids]`` may run on several threads at once (see ``Source``)."""
    return bool(getattr(source, "thread_safe", True))
