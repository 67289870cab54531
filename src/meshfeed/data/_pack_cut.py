"""Packed rows read from their documents: whole, or in part.

``read_packed`` builds whole rows: each piece's tokens scattered to its place, segment
ids and positions following from the plan with no read at all.

A device on a context mesh axis holds ``T/cp`` positions of each row (``context_layout``
maps its slice of the laid-out row to positions of the row as packed). The plan says,
from the rows' pieces alone, which piece covers each of those positions, so only the
documents of those pieces are read from the documents' source -- about ``1/cp`` of a
row's documents for rows of many short ones (a document longer than the slice is read
whole, as a full read reads it). Segment ids and positions follow from the plan with no
read at all. ``read_packed_at`` returns, besides the cut fields, the rows' pieces (how
many a row has, their lengths and columns), from which a row's lengths and starts are
made whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from meshfeed.data._pack_plan import PackPlan
from meshfeed.data._pack_store import StoredPlan
from meshfeed.data._ragged import Ragged
from meshfeed.data._sources import Source


class CutRows(NamedTuple):
    """Packed rows cut to some positions (``read_packed_at``)."""

    values: dict[str, np.ndarray]
    """Each packed field (tokens, fields packed alongside), ``[rows, positions]``."""
    segment_ids: np.ndarray
    """``int32 [rows, positions]``: 1, 2, ... by piece in its row, 0 in padding."""
    positions: np.ndarray
    """``int32 [rows, positions]``: the place in its piece, 0 in padding."""
    row_pieces: np.ndarray
    """How many pieces each row has (all of them, not only those cut to)."""
    lengths: np.ndarray
    """Each piece's length, row after row."""
    columns: np.ndarray
    """Each piece's start in its row, row after row."""


def _documents(values: object) -> Ragged:
    return values if isinstance(values, Ragged) else Ragged.from_list(list(values))  # type: ignore[arg-type]


def read_packed(
    source: Source,
    plan: PackPlan | StoredPlan,
    dtypes: Mapping[str, np.dtype],
    seq_len: int,
    rows: np.ndarray,
) -> CutRows:
    """Plan rows ``rows`` of ``source``'s documents, whole (``dtypes``: the packed
    fields, first the one planned by). Faster than ``read_packed_at`` at every position
    (1.4x, rows of 2,048): a scatter of whole pieces, no search per position."""
    n = len(rows)
    count, piece_doc, piece_start, length = plan.pieces_of(rows)
    piece = np.arange(len(length))
    row = np.repeat(np.arange(n), count)
    # Where each piece lands in its row, and its number in the row (1, 2, ...).
    ends = np.cumsum(length)
    row_first = np.repeat(np.cumsum(count) - count, count)
    column = ends - length - (ends - length)[row_first] if len(piece) else length
    segment = np.arange(len(piece)) - row_first + 1
    docs, which = np.unique(piece_doc, return_inverse=True)
    read = source[docs]
    total = int(length.sum())
    dest = np.repeat(row * seq_len + column - np.cumsum(length) + length, length)
    dest += np.arange(total)
    values: dict[str, np.ndarray] = {}
    lengths = None
    for name, dtype in dtypes.items():
        documents = _documents(read[name])
        if lengths is None:
            lengths = documents.lengths
        elif not np.array_equal(documents.lengths, lengths):
            raise _unaligned(name, dtypes)
        start = documents.offsets[which.reshape(-1)] + piece_start
        src = np.repeat(start - np.cumsum(length) + length, length) + np.arange(total)
        flat = np.zeros(n * seq_len, dtype)
        flat[dest] = documents.values[src]
        values[name] = flat.reshape(n, seq_len)
    segment_ids = np.zeros(n * seq_len, np.int32)
    segment_ids[dest] = np.repeat(segment, length)
    positions = np.zeros(n * seq_len, np.int32)
    positions[dest] = np.arange(total) - np.repeat(np.cumsum(length) - length, length)
    return CutRows(
        values,
        segment_ids.reshape(n, seq_len),
        positions.reshape(n, seq_len),
        count,
        length,
        column,
    )


def _unaligned(name: str, dtypes: Mapping[str, np.dtype]) -> ValueError:
    first = next(iter(dtypes))
    return ValueError(
        f"field {name!r} has documents of other lengths than {first!r}; "
        "pack packs fields alongside only when they align token for token."
    )


def read_packed_at(
    source: Source,
    plan: PackPlan | StoredPlan,
    dtypes: Mapping[str, np.dtype],
    seq_len: int,
    ids: np.ndarray,
    at: np.ndarray,
) -> CutRows:
    """Rows ``ids`` of the packing ``plan`` of ``source``'s documents at positions ``at``
    only: what ``Packed.__getitem__`` gives, cut to ``[:, at]``, reading from
    ``source`` only the documents whose pieces cover one of ``at`` (``ids`` and ``at``
    checked already; ``dtypes``: the packed fields, first the one planned by)."""
    n, m = len(ids), len(at)
    count, piece_doc, piece_start, length = plan.pieces_of(ids)
    row = np.repeat(np.arange(n), count)
    row_first = np.repeat(np.cumsum(count) - count, count)
    ends = np.cumsum(length)
    column = (ends - length) - (ends - length)[row_first] if len(length) else length
    # The piece covering each (row, position): the last piece starting at or before it,
    # if it is in that row and reaches that far (else padding).
    starts = row * seq_len + column
    asked = (np.arange(n)[:, None] * seq_len + at[None, :]).reshape(-1)
    piece = np.searchsorted(starts, asked, side="right") - 1
    held = piece >= 0
    piece = np.where(held, piece, 0)
    if len(length):
        held &= row[piece] == asked // seq_len
        held &= asked % seq_len < column[piece] + length[piece]
    else:
        held[:] = False
    piece, where = piece[held], np.flatnonzero(held)
    docs, which = np.unique(piece_doc[piece], return_inverse=True)
    offset = piece_start[piece] + asked[where] % seq_len - column[piece]  # in the document
    read = source[docs] if len(docs) else {}
    values: dict[str, np.ndarray] = {}
    lengths = None
    for name, dtype in dtypes.items():
        flat = np.zeros(n * m, dtype)
        if len(docs):
            documents = _documents(read[name])
            if lengths is None:
                lengths = documents.lengths
            elif not np.array_equal(documents.lengths, lengths):
                raise _unaligned(name, dtypes)
            flat[where] = documents.values[documents.offsets[which.reshape(-1)] + offset]
        values[name] = flat.reshape(n, m)
    segment_ids = np.zeros(n * m, np.int32)
    segment_ids[where] = piece - row_first[piece] + 1
    positions = np.zeros(n * m, np.int32)
    positions[where] = offset - piece_start[piece]
    return CutRows(
        values, segment_ids.reshape(n, m), positions.reshape(n, m), count, length, column
    )
