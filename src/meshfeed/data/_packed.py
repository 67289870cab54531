"""A packing plan served as a source: ``Packed``, the rows ``meshfeed.pack`` returns.

Each row is built from the documents its plan rows name (``_pack_cut``); with
``balance`` the rows are served in steps of even cost (``_pack_balance``), empty rows
making the last step whole. See ``_pack`` for what a row holds.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from meshfeed.data._pack_balance import served_rows
from meshfeed.data._pack_cut import CutRows, read_packed, read_packed_at
from meshfeed.data._pack_fields import (
    POSITIONS,
    SEGMENT_IDS,
    SEQ_LENS,
    SEQ_STARTS,
    lengths_and_starts,
)
from meshfeed.data._pack_plan import (
    PackPlan,
)
from meshfeed.data._pack_store import StoredPlan
from meshfeed.data._row_cost import Balance
from meshfeed.data._sources import (
    FieldSpec,
    Source,
    check_ids,
    check_positions,
    example_at,
    thread_safe,
)


def _dtype(source: Source, name: str) -> np.dtype:
    """A packed field's dtype: a ragged field's own, or an object field's first document's."""
    spec = source.fields[name]
    if spec.ragged:
        return np.dtype(spec.dtype)
    return np.asarray(source[np.array([0])][name][0]).dtype


class Packed:
    """Rows of ``seq_len`` tokens packed from a source's documents; build with ``meshfeed.pack``."""

    def __init__(
        self,
        source: Source,
        seq_len: int,
        packed: list[str],
        plan: PackPlan | StoredPlan,
        stats: dict[str, int],
        settings: dict[str, Any],
        seq_lens: bool = False,
        balanced: tuple[Balance, float, int] | None = None,
    ) -> None:
        self.source = source
        self.seq_len = seq_len
        self.field = packed[0]
        self.plan = plan
        self._balanced = balanced
        start = time.perf_counter()
        self._served = None if balanced is None else served_rows(plan, *balanced)
        self._balance_seconds = time.perf_counter() - start
        self._stats = stats
        self._settings = settings
        self._packed = packed
        self._fields = {name: FieldSpec((seq_len,), _dtype(source, name)) for name in self._packed}
        self._fields[SEGMENT_IDS] = FieldSpec((seq_len,), np.dtype(np.int32))
        self._fields[POSITIONS] = FieldSpec((seq_len,), np.dtype(np.int32))
        self._max_segments = settings["max_segments"] if seq_lens else None
        if self._max_segments is not None:
            s = self._max_segments
            self._fields[SEQ_LENS] = FieldSpec((s,), np.dtype(np.int32))
            self._fields[SEQ_STARTS] = FieldSpec((s + 1,), np.dtype(np.int32))
        self._digest = plan.digest()

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        """The packed fields, ``[seq_len]`` each (tokens, segment_ids, positions, ...)."""
        return self._fields

    @property
    def thread_safe(self) -> bool:
        """Whether rows may be read on several threads at once (if the documents' source may)."""
        return thread_safe(self.source)

    @property
    def ordered(self) -> bool:
        """Whether the rows must be read in order, as the documents' source must be (a
        mixture with stages); they are packed in its order, window by window."""
        return bool(getattr(self.source, "ordered", False))

    def __len__(self) -> int:
        """The number of packed rows (with ``balance``, and the empty rows that make the
        last step whole)."""
        return self.plan.rows if self._served is None else len(self._served)

    @property
    def step_rows(self) -> int | None:
        """With ``balance``: rows a step takes, in order (``BalancedSteps``); else ``None``."""
        return None if self._balanced is None else self._balanced[2]

    def row_costs(self, ids: np.ndarray) -> np.ndarray:
        """With ``balance``: the cost of rows ``ids`` under its cost model."""
        if self._balanced is None:
            raise ValueError("row_costs: this packed source has no balance=; pack with one.")
        assert self._served is not None
        return self._served.costs(ids)

    def row_tokens(self, ids: np.ndarray) -> np.ndarray:
        """The tokens rows ``ids`` hold (the rest of each is padding)."""
        rows = self._plan_rows(ids)
        out = np.zeros(len(rows), np.int64)
        real = rows >= 0
        if real.any():
            counts, lengths = self.plan.lengths_of(rows[real])
            starts = (np.cumsum(counts) - counts)[counts > 0]
            out[np.flatnonzero(real)[counts > 0]] = np.add.reduceat(lengths, starts)
        return out

    def _plan_rows(self, ids: np.ndarray) -> np.ndarray:
        """The plan rows of rows ``ids`` (``-1``: an empty row)."""
        ids = np.asarray(ids, np.int64)
        return ids if self._served is None else self._served.plan_rows(ids)

    @property
    def fingerprint(self) -> dict[str, Any]:
        """What the rows depend on, which the loader's state carries (the settings, the
        plan's digest, and the packed source's own fingerprint)."""
        inner = getattr(self.source, "fingerprint", None)
        balanced = {}
        if self._balanced is not None:
            balance, token_cost, step_rows = self._balanced
            name = balance if isinstance(balance, str) else getattr(balance, "__qualname__", "fn")
            balanced = {"balance": [name, token_cost, step_rows]}
        return {
            "pack": {**self._settings, "seq_len": self.seq_len, "plan": self._digest, **balanced},
            **({"source": inner} if inner is not None else {}),
        }

    def stats(self) -> dict[str, float]:
        """Documents, rows, tokens, padding (and its fraction), split, truncated and
        dropped documents and tokens; with ``balance``, ``balance_seconds``: the time this
        process spent ordering the rows by cost (reading a kept order, if there was one)."""
        tokens = self.plan.tokens
        slots = len(self) * self.seq_len
        balance = {} if self._balanced is None else {"balance_seconds": self._balance_seconds}
        return {
            **self._stats,
            "rows": len(self),
            "tokens": tokens,
            "padding": slots - tokens,
            "padding_fraction": (slots - tokens) / slots,
            **balance,
        }

    def pieces(self, row: int) -> list[tuple[int, int, int]]:
        """The pieces of ``row``, in order: (document id, start in it, length)."""
        rows = self._plan_rows(np.array([row]))
        if rows[0] < 0:
            return []
        _, doc, start, length = self.plan.pieces_of(rows)
        return [(int(d), int(s), int(n)) for d, s, n in zip(doc, start, length, strict=True)]

    def __getitem__(self, ids: np.ndarray | int) -> dict[str, np.ndarray]:
        """The packed rows ``ids``, built from the documents the plan puts in them."""
        if isinstance(ids, int | np.integer):  # source[i]: one example
            return example_at(self, ids)
        ids = check_ids(ids, len(self), "this packed source")
        rows = self._plan_rows(ids)
        if (rows < 0).any():  # empty rows (balanced steps): all padding
            return self._with_empty(rows, self._rows)
        return self._rows(rows)

    def _with_empty(self, rows: np.ndarray, read: Any) -> dict[str, np.ndarray]:
        """``read(plan rows)`` for the real rows, zero rows (padding) for the empty ones."""
        real = rows >= 0
        got = read(rows[real]) if real.any() else None
        out = {}
        for name, spec in self._fields.items():
            width = got[name].shape[1] if got is not None else spec.shape[0]
            out[name] = np.zeros((len(rows), width), spec.dtype)
            if name in (SEQ_LENS, SEQ_STARTS):
                out[name][:] = -1
            if got is not None:
                out[name][real] = got[name]
        return out

    def _rows(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Plan rows ``rows``, built from the documents the plan puts in them."""
        dtypes = {name: self._fields[name].dtype for name in self._packed}
        return self._fields_of(read_packed(self.source, self.plan, dtypes, self.seq_len, rows))

    def _fields_of(self, read: CutRows) -> dict[str, np.ndarray]:
        """The row's fields, in order, from what was read (lengths and starts made)."""
        out = {**read.values, SEGMENT_IDS: read.segment_ids, POSITIONS: read.positions}
        if self._max_segments is not None:
            out[SEQ_LENS], out[SEQ_STARTS] = lengths_and_starts(
                read.row_pieces, read.lengths, read.columns, self._max_segments
            )
        return {name: out[name] for name in self._fields}

    @property
    def sequence_fields(self) -> tuple[str, ...]:
        """The ``[seq_len]`` fields ``read_at`` cuts (``seq_lens`` and ``seq_starts``
        describe the whole row)."""
        return (*self._packed, SEGMENT_IDS, POSITIONS)

    def read_at(self, ids: np.ndarray, at: np.ndarray) -> dict[str, np.ndarray]:
        """Rows ``ids``, each ``[seq_len]`` field cut to the positions ``at``
        (``self[ids][field][:, at]``), reading only the documents those positions reach
        (``PartialRows``: a device's slice of a row under a context layout)."""
        ids = check_ids(ids, len(self), "this packed source")
        at = check_positions(at, self.seq_len, "this packed source")
        rows = self._plan_rows(ids)
        if (rows < 0).any():  # empty rows (balanced steps): all padding
            return self._with_empty(rows, lambda real: self._rows_at(real, at))
        return self._rows_at(rows, at)

    def _rows_at(self, rows: np.ndarray, at: np.ndarray) -> dict[str, np.ndarray]:
        dtypes = {name: self._fields[name].dtype for name in self._packed}
        return self._fields_of(
            read_packed_at(self.source, self.plan, dtypes, self.seq_len, rows, at)
        )

    def __repr__(self) -> str:
        s = self.stats()
        return (
            f"Packed({len(self)} rows of {self.seq_len} from {s['documents']} documents, "
            f"{100 * s['padding_fraction']:.1f}% padding)"
        )
