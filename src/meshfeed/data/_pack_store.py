"""The packing plan as data: built once beside the documents, read by range everywhere.

A plan depends on the documents' lengths and ``pack``'s settings, not on the processes,
so one build serves every host and every restart. ``pack`` over a meshfeed folder (local
or behind a URL) keeps its plan in ``<folder>/meshfeed.pack/<key>/`` -- or under
``plan_dir=`` -- where ``key`` hashes the settings. The plan is a meshfeed folder
itself: one example per packed row, with ragged fields ``doc``, ``piece`` and ``length``
(the row's pieces); its manifest carries the record (``pack``: the settings, the data's
identity, the counts, the plan's digest). Opening it reads the manifest (one request); a
step then reads only its rows, by range, as any field is read.

It is built by ``_pack_build`` (a shard of windows at a time, on this process, on
worker processes or as Ray tasks), the same bytes from any builder, so hosts that open
an unbuilt plan at once write the same files and read the same plan; its manifest is
written last. A plan whose data changed since (the data's catalog is not the one on
record) is refused by name, with what rebuilds it. The plan's digest -- which the
loader's state carries -- is the one the same plan made in memory has, so a state
restores across the two.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Mapping
from typing import Any, cast

import numpy as np

from meshfeed.data._folder import MANIFEST, join, read_json
from meshfeed.data._pack_build import PlanExecutor, build_plan
from meshfeed.data._ragged import Ragged
from meshfeed.data._sources import Source, document_lengths
from meshfeed.data._store import open_source
from meshfeed.data._writer import FolderWriter

PLAN_FOLDER = "meshfeed.pack"
PLAN_FORMAT = "meshfeed.pack-plan/1"


class StoredPlan:
    """A plan kept as a folder: what ``Packed`` asks of a ``PackPlan``, read by range."""

    def __init__(self, rows: Source, record: Mapping[str, Any], where: str) -> None:
        self.seq_len = int(record["seq_len"])
        self.record = dict(record)
        self.where = where
        self._rows = rows

    @property
    def rows(self) -> int:
        """The number of packed rows."""
        return int(self.record["rows"])

    @property
    def tokens(self) -> int:
        """Tokens the rows hold."""
        return int(self.record["tokens"])

    @property
    def nbytes(self) -> int:
        """Bytes the plan holds in memory (none, but what a read brings)."""
        return 0

    def digest(self) -> str:
        """The plan's digest, as ``PackPlan.digest`` makes it."""
        return str(self.record["digest"])

    def lengths_of(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """How many pieces each of ``rows`` has, and their lengths (``PackPlan.lengths_of``)."""
        length = cast(Ragged, self._rows[np.asarray(rows, dtype=np.int64)]["length"])
        return length.lengths.astype(np.int64), length.values.astype(np.int64)

    def pieces_of(self, rows: np.ndarray) -> tuple[np.ndarray, ...]:
        """The pieces of ``rows`` (see ``PackPlan.pieces_of``), read from the folder."""
        got = self._rows[np.asarray(rows, dtype=np.int64)]
        doc, piece, length = (cast(Ragged, got[name]) for name in ("doc", "piece", "length"))
        return (
            doc.lengths.astype(np.int64),
            doc.values.astype(np.int64),
            piece.values.astype(np.int64) * self.seq_len,
            length.values.astype(np.int64),
        )


def plan_key(seq_len: int, settings: Mapping[str, Any]) -> str:
    """The name of the plan of these settings: what the rows depend on besides the data."""
    text = json.dumps({"seq_len": seq_len, **settings}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def location(source: Source, plan_dir: Any) -> tuple[str, Mapping[str, Any] | None] | None:
    """Where ``source``'s plans are kept (a folder, its storage options), or ``None``: in
    memory (``plan_dir=False``, or a source that is not a folder and no ``plan_dir``)."""
    if plan_dir is False:
        return None
    origin = getattr(source, "origin", None)
    if plan_dir is not None:
        if not isinstance(plan_dir, str | os.PathLike):
            raise TypeError(f"plan_dir={plan_dir!r} must be a path or URL, or False.")
        if identity(source) is None:
            raise ValueError(
                f"plan_dir= keeps the plan of a meshfeed folder's documents (open_source), "
                f"whose catalog says when they change; {type(source).__name__} has none. "
                "Leave plan_dir out: the plan is made in memory."
            )
        return os.fspath(plan_dir), (origin[1] if origin else None)
    if origin is None or identity(source) is None:
        return None
    return join(origin[0], PLAN_FOLDER), origin[1]


def identity(source: Source) -> str | None:
    """What says the documents are the ones a plan was made of: their catalog's digest."""
    found = getattr(source, "catalog_digest", None)
    return found if isinstance(found, str) else None


def open_plan(
    source: Source,
    field: str,
    seq_len: int,
    settings: Mapping[str, Any],
    where: tuple[str, Mapping[str, Any] | None],
    *,
    rebuild: bool = False,
    workers: int = 1,
    executor: PlanExecutor = "local",
) -> StoredPlan | None:
    """The stored plan of ``source`` under these settings, built first if it is not
    there yet; ``None`` where it cannot be written (read-only data and no
    ``plan_dir``), said on stderr: the plan is then made in memory."""
    root, options = where
    folder = join(root, plan_key(seq_len, settings))
    try:
        if rebuild:
            FolderWriter(folder, options).clear()
        manifest = read_json(join(folder, MANIFEST), options)
        if manifest is None:
            manifest = _build(source, field, seq_len, settings, folder, options, workers, executor)
    except OSError as error:  # read-only data, say: the plan cannot go there
        sys.stderr.write(
            f"meshfeed: cannot keep the packing plan in {folder} ({error}); it is made "
            "in memory, on every start. Pass pack(..., plan_dir=) a writable place.\n"
        )
        return None
    record = manifest.get("pack") or {}
    if record.get("format") != PLAN_FORMAT:
        raise ValueError(f"{folder} is not a packing plan (no {PLAN_FORMAT!r} record).")
    if record.get("data") != identity(source):
        name = getattr(source, "name", "the source")
        raise ValueError(
            f"the packing plan {folder} was made from other documents than {name} holds "
            f"now (its catalog changed since the plan was built); build it again: meshfeed "
            f"pack {name} --seq-len {seq_len} --rebuild (with the same settings), or "
            f"pack(..., rebuild_plan=True)."
        )
    return StoredPlan(open_source(folder, storage_options=options), record, folder)


def _build(
    source: Source,
    field: str,
    seq_len: int,
    settings: Mapping[str, Any],
    folder: str,
    options: Mapping[str, Any] | None,
    workers: int,
    executor: PlanExecutor,
) -> dict[str, Any]:
    """Plans ``source``'s documents into ``folder`` (``_pack_build``); its manifest."""
    lengths = document_lengths(source, field)
    name = getattr(source, "name", "the source")
    sys.stderr.write(
        f"meshfeed: planning the packing of {len(lengths):,} documents of {name} into "
        f"{folder} (once: later opens, on any host, read it)\n"
    )
    record: dict[str, Any] = {
        "format": PLAN_FORMAT,
        "seq_len": seq_len,
        "settings": dict(settings),
        "data": identity(source),
        "documents": len(lengths),
    }
    return build_plan(
        lengths, seq_len, settings, folder, options, record, workers=workers, executor=executor
    )
