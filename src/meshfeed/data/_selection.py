"""``Selection``: the examples of a source that a predicate kept, as a source of its own.

A filter that keeps every promise of an unfiltered source has to be a source: then the
global shuffle, every kept example once per epoch, the same batches on any number of
processes and a state that resumes on another process count all come from the schedule
as they do for any other source. ``Selection`` is that source: the kept ids of
``source``, sorted, and ``selection[ids]`` is ``source[kept[ids]]`` -- random access
through one more gather. ``meshfeed.select`` finds the ids once (``prepare/_select``).

The ids are stored sorted, as ``uint32`` while the source has fewer than 2**32 examples
(4 bytes a kept example), else ``int64``; a selection read from the cache is a memory
map of them, so opening one costs nothing however many examples it keeps.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from meshfeed.data._sources import (
    Column,
    FieldSpec,
    Source,
    check_ids,
    document_lengths,
    example_at,
)


def kept_dtype(n: int) -> np.dtype:
    """The dtype the kept ids of a source of ``n`` examples are stored in."""
    return np.dtype(np.uint32 if n <= np.iinfo(np.uint32).max else np.int64)


class Selection:
    """The examples of ``source`` a predicate kept (``meshfeed.select``): a source.

    ``len(selection)`` is the number kept; ``selection[ids]`` reads kept examples
    ``ids`` (``0 .. len - 1``, in the source's order) from ``source``. ``kept`` holds
    their ids in ``source``, sorted; ``key`` names the selection (the source's and the
    predicate's fingerprints), and goes into a loader's state so that a state restores
    only over the same selection.
    """

    def __init__(self, source: Source, kept: np.ndarray, *, key: str) -> None:
        kept = np.asarray(kept)
        if kept.ndim != 1:
            raise ValueError(f"kept must be a 1-D array of ids, got shape {kept.shape}.")
        if len(kept) and (int(kept[0]) < 0 or int(kept[-1]) >= len(source)):
            raise ValueError(f"kept ids must be in [0, {len(source)}) of the source.")
        self._source = source
        self._kept = kept
        self._key = key

    @property
    def source(self) -> Source:
        """The source the examples are kept from."""
        return self._source

    @property
    def kept(self) -> np.ndarray:
        """The kept examples' ids in ``source``, sorted."""
        return self._kept

    @property
    def key(self) -> str:
        """The hash of the source and the predicate the selection was built from."""
        return self._key

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        """The source's fields."""
        return self._source.fields

    @property
    def thread_safe(self) -> bool:
        """Whether the source may be read from several threads at once."""
        return bool(getattr(self._source, "thread_safe", True))

    @property
    def fingerprint(self) -> dict[str, Any]:
        """What a loader's state records of this source (the selection's key)."""
        inner = getattr(self._source, "fingerprint", None)
        return {"selection": self._key, **({"source": inner} if inner is not None else {})}

    def __len__(self) -> int:
        """The number of kept examples."""
        return len(self._kept)

    def ids_in_source(self, ids: np.ndarray) -> np.ndarray:
        """The source's ids of kept examples ``ids``."""
        return self._kept[check_ids(ids, len(self._kept), "a selection")].astype(np.int64)

    def __getitem__(self, ids: np.ndarray | int) -> Mapping[str, Column]:
        """Kept examples ``ids``: the source's rows of their ids there."""
        if isinstance(ids, int | np.integer):  # source[i]: one example
            return example_at(self, ids)
        return self._source[self.ids_in_source(ids)]

    @property
    def read_into(self) -> Any:
        """The source's ``read_into`` through the selection (an ``AttributeError`` where
        the source has none, so a reader checks for it as for any source)."""
        read = getattr(self._source, "read_into", None)
        if read is None:
            raise AttributeError(f"{type(self._source).__name__} has no read_into")
        return lambda ids, out: read(self.ids_in_source(ids), out)

    def lengths(self, field: str) -> np.ndarray:
        """Every kept document's length in the ragged ``field`` (what ``pack`` plans by)."""
        return document_lengths(self._source, field)[self._kept]

    def __reduce__(self) -> tuple[Any, ...]:  # workers get the ids, not the memory map
        return (_selection, (self._source, np.asarray(self._kept), self._key))

    def __repr__(self) -> str:
        return f"Selection({len(self)} of {len(self._source)} examples of {self._source!r})"


def _selection(source: Source, kept: np.ndarray, key: str) -> Selection:
    return Selection(source, kept, key=key)
