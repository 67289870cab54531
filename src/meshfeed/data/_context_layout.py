"""``context_layout``: every row of a source laid out for a context mesh axis, on the host.

A row split evenly over the ``cp`` devices of a context axis in its own order gives
the device with the row's end the most causal attention to do; the context layouts of
``core/_context_layout`` (dual chunk, striped) permute each row so that the same even
split balances it. Doing it here, in the source, rather than on the devices costs one
gather per field on the host and no collective, and it lets a device read only its own
slice: the positions a device holds in the laid-out row map through the permutation
to positions of the row as stored, and ``read_at`` reads just those (through the
wrapped source's own ``read_at`` where it has one, so a packed source could read only
the documents that reach them).

The rows are the same rows, only permuted, so the source keeps the wrapped source's
length, fields and fingerprint: a loader's state moves between layouts and ``cp``s.
Which fields move is fixed by their shape alone: those of shape ``[T, ...]``, ``T`` the
row length; fields that describe a row in its own order (a packed row's ``seq_lens``
and ``seq_starts``) keep their values, and a loss needs nothing undone since its
targets move with the tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import numpy as np

from meshfeed.core._context_layout import ContextKind, check_layout, order
from meshfeed.data._pack_fields import SEGMENT_IDS
from meshfeed.data._ragged import Ragged
from meshfeed.data._sources import (
    Column,
    FieldSpec,
    PartialRows,
    Source,
    check_ids,
    check_positions,
    example_at,
    thread_safe,
)

_ROWS_IN_OWN_ORDER = frozenset({"read_into"})
"""What the wrapped source offers that would give rows in their own order: not passed on."""


def _row_length(source: Source) -> int:
    """The source's row length: its ``segment_ids`` field's, else its ``seq_len``."""
    spec = source.fields.get(SEGMENT_IDS)
    if spec is not None and not spec.ragged and len(spec.shape) >= 1:
        return int(spec.shape[0])
    seq_len = getattr(source, "seq_len", None)
    if isinstance(seq_len, int | np.integer) and not isinstance(seq_len, bool):
        return int(seq_len)
    raise ValueError(
        f"context_layout needs rows of a known length, but the source has neither a "
        f"{SEGMENT_IDS!r} field of shape [T] nor a seq_len (its fields: "
        f"{list(source.fields)}); pack its documents into rows first: "
        "context_layout(meshfeed.pack(source, seq_len), cp)."
    )


def _sequence_fields(source: Source, length: int) -> tuple[str, ...]:
    """The fields laid out: the wrapped source's own ``sequence_fields`` where it says
    them, else every fixed-shape field whose dimension 0 is the row length."""
    if isinstance(source, PartialRows):
        return tuple(source.sequence_fields)
    return tuple(
        name
        for name, spec in source.fields.items()
        if not spec.ragged and len(spec.shape) >= 1 and spec.shape[0] == length
    )


class ContextLayout:
    """The rows of ``source`` with every sequence field in a context layout; build with
    ``meshfeed.sources.context_layout``.

    ``layout[ids][f]`` is ``source[ids][f][:, order]`` for each sequence field ``f``
    (``order``: ``meshfeed.train.restore_order``'s permutation, forward) and
    ``source[ids][f]`` for the others. Everything else the wrapped source offers --
    ``origin``, ``lengths``, a packed source's ``stats`` and ``pieces`` (in the row's
    own order) -- is passed on as it is.
    """

    def __init__(self, source: Source, cp: int, kind: ContextKind, stripe: int) -> None:
        length = _row_length(source)
        check_layout(length, cp, kind, stripe)
        self._source = source
        self._length = length
        self._cp = int(cp)
        self._stripe = int(stripe)
        self._kind: ContextKind = kind
        self._sequence = _sequence_fields(source, length)
        if not self._sequence:
            raise ValueError(
                f"context_layout found no field of shape [{length}, ...] (the row length) "
                f"to lay out among the source's fields {list(source.fields)}; pass a "
                "source of packed rows (meshfeed.pack(source, seq_len))."
            )
        self._order = order(length, self._cp, kind, self._stripe)

    @property
    def source(self) -> Source:
        """The source whose rows are laid out."""
        return self._source

    @property
    def cp(self) -> int:
        """Devices on the context axis."""
        return self._cp

    @property
    def kind(self) -> ContextKind:
        """The context layout, ``"dual_chunk"`` or ``"striped"``."""
        return self._kind

    @property
    def stripe(self) -> int:
        """Tokens dealt at a time (``"striped"``; 1 for ``"dual_chunk"``)."""
        return self._stripe

    @property
    def seq_len(self) -> int:
        """Tokens per row, ``T``."""
        return self._length

    @property
    def order(self) -> np.ndarray:
        """Position in the row as stored of each position of the laid-out row (read-only)."""
        return self._order

    @property
    def sequence_fields(self) -> tuple[str, ...]:
        """The fields laid out (shape ``[T, ...]``); the others keep their values."""
        return self._sequence

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        """The wrapped source's fields (a layout permutes, it changes no shape)."""
        return self._source.fields

    @property
    def thread_safe(self) -> bool:
        """Whether rows may be read on several threads at once (if the wrapped source's may)."""
        return thread_safe(self._source)

    @property
    def ordered(self) -> bool:
        """Whether the rows must be read in order (if the wrapped source's must)."""
        return bool(getattr(self._source, "ordered", False))

    @property
    def fingerprint(self) -> Any:
        """The wrapped source's fingerprint, since the rows are the same rows; a loader's
        state restores under another ``cp`` or layout."""
        return getattr(self._source, "fingerprint", None)

    def __len__(self) -> int:
        """The number of rows, the wrapped source's."""
        return len(self._source)

    def __getitem__(self, ids: np.ndarray | int) -> Mapping[str, Column]:
        """Rows ``ids``, each sequence field laid out."""
        if isinstance(ids, int | np.integer):  # source[i]: one example
            return example_at(self, ids)
        rows = self._source[check_ids(ids, len(self), "this context layout")]
        return self._take(rows, self._order)

    def read_at(self, ids: np.ndarray, at: np.ndarray) -> Mapping[str, Column]:
        """Rows ``ids``, each sequence field cut to positions ``at`` of the laid-out row
        (``self[ids][f][:, at]``), the other fields whole: only those positions are
        asked of the wrapped source where it reads part of a row (``PartialRows``)."""
        ids = check_ids(ids, len(self), "this context layout")
        stored = self._order[check_positions(at, self._length, "this context layout")]
        if isinstance(self._source, PartialRows):
            return dict(self._source.read_at(ids, stored))
        return self._take(self._source[ids], stored)

    def _take(self, rows: Mapping[str, Column], where: np.ndarray) -> dict[str, Column]:
        out: dict[str, Column] = {}
        for name, values in rows.items():
            if name in self._sequence and not isinstance(values, Ragged):
                values = np.take(np.asarray(values), where, axis=1)
            out[name] = values
        return out

    def bind(self, *args: Any, **kwargs: Any) -> ContextLayout:
        """The wrapped source bound to a loader's steps (a mixture by stage), laid out
        alike; the source itself where it counts no steps."""
        bind = getattr(self._source, "bind", None)
        if not callable(bind):
            return self
        bound = cast(Source, bind(*args, **kwargs))
        return ContextLayout(bound, self._cp, self._kind, self._stripe)

    def __getattr__(self, name: str) -> Any:
        """What else the wrapped source offers (``origin``, ``lengths``, ...), as it is;
        never a read of rows in their own order (``read_into``)."""
        if name.startswith("__") or name in _ROWS_IN_OWN_ORDER or "_source" not in vars(self):
            raise AttributeError(name)
        return getattr(self._source, name)

    def __repr__(self) -> str:
        stripe = f", stripe={self._stripe}" if self._kind == "striped" else ""
        return f"ContextLayout({self._source!r}, cp={self._cp}, kind={self._kind!r}{stripe})"


def context_layout(
    source: Source, cp: int, kind: ContextKind = "dual_chunk", stripe: int = 1
) -> ContextLayout:
    """``source``'s rows laid out for a context mesh axis of ``cp`` devices: a ``Source``.

    Every field of shape ``[T, ...]`` -- ``T`` the row length, the length of
    ``segment_ids`` (else the source's ``seq_len``) -- is permuted in every row by the
    context layout, so that an even split of dimension 1 over ``cp`` devices
    (``NamedSharding(mesh, P('data', 'context'))``) gives each device a balanced share
    of causal attention. Tokens, targets, segment ids, positions and loss masks move
    together, so a loss per token is the row's loss; ``meshfeed.train.restore_order``
    puts outputs back in the row's own order. Fields of other shapes that describe the
    row in its own order (a packed row's ``seq_lens`` ``[S]`` and ``seq_starts``
    ``[S+1]``) are not permuted. Length, fields, fingerprint and what else the source
    offers are the wrapped source's, so a loader's state restores under another ``cp``.

    With ``strategy="per_device"`` each device reads only its own slice of each row
    (``read_at``, the ``PartialRows`` interface), unless there is a ``transform`` or a
    ``record_transform``: those see whole records, so every device reads its rows whole
    then, as for any source.

    Args:
      source: a source of rows (``meshfeed.pack(...)``, or any with a ``segment_ids``
        field of shape ``[T]`` or a ``seq_len``).
      cp: devices on the context mesh axis.
      kind: ``"dual_chunk"`` (MaxText's and Transformer Engine's load balancing: 2·cp
        chunks, device ``i`` takes chunks ``i`` and ``2·cp-1-i``; ``T`` a multiple of
        2·cp) or ``"striped"`` (Transformer Engine's: tokens dealt round-robin in
        stripes; ``T`` a multiple of cp·stripe). Any ``cp`` >= 1, odd ones too.
      stripe: tokens dealt at a time, for ``"striped"``.

    Raises:
      ValueError: a ``cp``, ``kind`` or ``stripe`` that is not one, a row length the
        layout does not divide, or a source without rows of a known length.

    Example:
      >>> mesh = meshfeed.make_mesh(data=2, context=4)  # doctest: +SKIP
      >>> loader = meshfeed.Loader(  # doctest: +SKIP
      ...     context_layout(meshfeed.pack(docs, 8192), cp=4), global_batch_size=8,
      ...     sharding=NamedSharding(mesh, P("data", "context")), strategy="per_device")
    """
    if not isinstance(source, Source):
        raise TypeError(f"context_layout takes a meshfeed.Source, got {type(source).__name__}.")
    check_layout(None, cp, kind, stripe)  # the arguments before the source is asked
    return ContextLayout(source, cp, kind, stripe)
