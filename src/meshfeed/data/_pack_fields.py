"""What a packed row holds: the packed fields checked, and its documents' lengths and
starts in static slots.

``pack`` packs a source's token field and the ragged fields alongside it (one value per
token); a per-document field has no place in a row of several documents, and a 2-D
document no place in a 1-D row, so both are refused with the way out. Kernels that take
packed rows as lengths and starts (cuDNN's packed path, Transformer Engine's
``SequenceDescriptor``) want them in a static number of slots, -1 where unused: that
form is made here from the plan's pieces.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from meshfeed.data._sources import Source, field_text

SEGMENT_IDS = "segment_ids"
POSITIONS = "positions"
SEQ_LENS = "seq_lens"
SEQ_STARTS = "seq_starts"


def lengths_and_starts(
    count: np.ndarray, length: np.ndarray, column: np.ndarray, slots: int
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's documents' lengths ``[rows, slots]`` and starts, then the end of the
    last, ``[rows, slots + 1]`` (``int32``, -1 in unused slots), from the pieces' counts
    per row, lengths and columns (row by row, in order)."""
    rows = len(count)
    slot = np.arange(len(length)) - np.repeat(np.cumsum(count) - count, count)
    row = np.repeat(np.arange(rows), count)
    lengths = np.full((rows, slots), -1, np.int32)
    starts = np.full((rows, slots + 1), -1, np.int32)
    lengths[row, slot] = length
    starts[row, slot] = column
    ends = np.zeros(rows, np.int64)
    np.add.at(ends, row, length)
    held = count > 0
    starts[np.flatnonzero(held), count[held]] = ends[held]
    return lengths, starts


def packed_fields(source: Source, field: str, alongside: Sequence[str] | None) -> list[str]:
    """``field`` and the fields packed with it, checked."""
    fields = dict(source.fields)
    if field not in fields:
        ragged = [k for k, s in fields.items() if s.ragged]
        raise ValueError(
            f"pack(field={field!r}): the source has no such field; its fields are "
            f"{list(fields)}. Pass field= naming the token field, one of {ragged}."
        )
    for name in (SEGMENT_IDS, POSITIONS):
        if name in fields:
            raise ValueError(
                f"the source has a field named {name!r}, which pack adds itself; rename it."
            )
    if alongside is None:
        alongside = [name for name in fields if name != field]
    elif isinstance(alongside, str) or not all(isinstance(a, str) for a in alongside):
        raise TypeError(f"alongside={alongside!r} must be a list of field names.")
    unknown = [a for a in alongside if a not in fields or a == field]
    if unknown:
        raise ValueError(
            f"alongside={list(alongside)} names {unknown}, not other fields of the source "
            f"({[k for k in fields if k != field]})."
        )
    for name in [field, *alongside]:
        spec = fields[name]
        documents = spec.ragged or spec.dtype == np.dtype(object)
        if not documents:
            raise ValueError(
                f"pack packs documents of any length, but field {name!r} has a fixed "
                f"shape ({field_text(spec)}). A packed row holds several documents, so a "
                f"per-document value has no place in it: give it one value per token (a "
                f"ragged field aligned with {field!r}), or leave it out: pack(..., "
                f"alongside=[...]) without {name!r}."
            )
        if spec.ragged and len(spec.shape) > 1:
            out = (
                ""
                if name == field
                else f", or leave it out: pack(..., alongside=[...]) without {name!r}"
            )
            raise ValueError(
                f"pack packs 1-D documents, but field {name!r} has documents of "
                f"{field_text(spec)} (2-D values); flatten them{out}."
            )
    return [field, *alongside]
