"""Mixtures: several sources behind one, in proportions that may change by stage.

``mix([a, b], weights=[0.7, 0.3])`` is itself a ``Source``: example ``k`` of the mixture
is a pure function of ``k`` (``MixOrder``), so the loader shuffles, shards, checkpoints
and resumes it like any other source, and its state is the loader's state.

``mix([a, b], weights=[(0, [0.9, 0.1]), (8000, [0.5, 0.5], 500)])`` changes the weights
by stage, at steps of the loader that reads it (the second stage reached by a linear
blend over 500 steps). Such a mixture is *ordered*: its positions must reach the batches
in step order, or a stage starting at step 8,000 would be smeared over the whole run.
So the mixture does the shuffling itself -- each source is read in a keyed order that
changes every pass -- and the loader reads it position by position: a ``Loader`` over it
needs ``shuffle=False`` (and refuses ``shuffle=True``), and binds the mixture to its
batch sizes (``bind``) so that stage starts in steps become positions. Read through
something else (``pack``), the mixture needs ``global_batch_size=`` to know its steps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from meshfeed.core._stages import BatchSizeArg, BatchSizes, Stage, Stages
from meshfeed.data._mix_order import BLOCK, MixOrder, Weights, shares
from meshfeed.data._sources import (
    FieldSpec,
    Source,
    check_ids,
    describe,
    document_lengths,
    example_at,
    gather_by_part,
    thread_safe,
)

WeightsArg = Sequence[float] | Sequence[tuple[Any, ...]]
"""Mixture weights: one number per source, or stages ``(start_step, weights)`` and
``(start_step, weights, blend_steps)``."""
_EXAMPLE = "[(0, [0.9, 0.1]), (1000, [0.5, 0.5])]"


def _weights(n: int, *, stages: bool) -> Any:
    def check(value: object, where: str) -> Weights:
        if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != n:
            raise ValueError(f"{where}: {value!r} must be one weight per source ({n}).")
        rule = ">= 0" if stages else "> 0"
        if not all(
            isinstance(w, int | float)
            and not isinstance(w, bool)
            and math.isfinite(w)
            and (w > 0 or (stages and w == 0))
            for w in value
        ):
            raise ValueError(f"{where}: weights {list(value)} must be finite numbers {rule}.")
        w = np.asarray(value, np.float64)
        if w.sum() <= 0:
            raise ValueError(f"{where}: weights {list(value)} give no source a share.")
        w = w / w.sum()
        counts = shares(w, BLOCK)
        if ((w > 0) & (counts == 0)).any():
            small = np.flatnonzero((w > 0) & (counts == 0)).tolist()
            raise ValueError(
                f"{where}: weights {list(value)} give source(s) {small} no place in a block "
                f"of {BLOCK}; a weight must be 0 or at least 1/{BLOCK} of the total."
            )
        return tuple(w.tolist())

    return check


class Mixture:
    """A deterministic mixture of sources; build with ``meshfeed.mix``."""

    def __init__(
        self,
        sources: Sequence[Source],
        stages: Stages[Weights],
        *,
        length: int | None,
        seed: int,
        shuffle: bool,
        sizes: BatchSizes | None,
        sizes_given: bool,
    ) -> None:
        self.sources = list(sources)
        self.stages = stages
        self.seed = seed
        self.shuffle = shuffle
        self._lengths = [len(s) for s in self.sources]
        self._length_given = length
        self._sizes = sizes
        self._sizes_given = sizes_given
        self._order: MixOrder | None = None
        self._len: int | None = None
        if sizes is not None:
            self._order = MixOrder(stages, sizes, self._lengths, seed=seed, shuffle=shuffle)
            self._len = length if length is not None else self._covering_length()

    @property
    def weights(self) -> list[float]:
        """The weights of the first stage, normalised (all of them, for a fixed mixture)."""
        return list(self.stages.stages[0].value)

    @property
    def ordered(self) -> bool:
        """Whether the positions must be read in order, as they must when the weights
        change by stage."""
        return len(self.stages) > 1

    @property
    def batch_sizes(self) -> BatchSizes | None:
        """The steps the stages count (``None`` until bound, for a scheduled mixture)."""
        return self._sizes if self.ordered else None

    def bind(self, sizes: BatchSizes) -> Mixture:
        """This mixture with its stages counted in steps of ``sizes`` (a loader's batch
        sizes); itself when the weights are fixed or it counts those steps already."""
        if not self.ordered:
            return self
        if self._sizes_given:
            if self._sizes is not None and self._sizes.stages.to_json() != sizes.stages.to_json():
                mine = [[s.start, s.value] for s in self._sizes.stages]
                theirs = [[s.start, s.value] for s in sizes.stages]
                raise ValueError(
                    f"the mixture counts its stages in steps of global_batch_size={mine}, "
                    f"the loader reads steps of {theirs}; give both the same."
                )
            return self
        return Mixture(
            self.sources,
            self.stages,
            length=self._length_given,
            seed=self.seed,
            shuffle=self.shuffle,
            sizes=sizes,
            sizes_given=False,
        )

    def _require(self) -> MixOrder:
        if self._order is None:
            raise TypeError(
                "this mixture changes its weights by stage, in steps, but does not know "
                "how many positions a step reads yet: load it with meshfeed.Loader (which "
                "binds it to its global_batch_size), or pass mix(..., global_batch_size=)."
            )
        return self._order

    def _covering_length(self) -> int:
        """The shortest mixture that shows every example of every source at least once."""
        order = self._require()
        ends = []
        for s, n in enumerate(self._lengths):
            p = order.position_of(s, n - 1)
            if p is None:
                raise ValueError(
                    f"sources[{s}] gets no share in the last stage before each of its "
                    f"{n} examples has appeared, so the mixture has no natural end; pass "
                    "mix(..., length=) (the positions to read: steps x batch size)."
                )
            ends.append(p)
        return max(ends) + 1

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        """Each field's shape and dtype (per example), by name."""
        return self.sources[0].fields

    @property
    def thread_safe(self) -> bool:
        """Whether ``source[ids]`` may run on several threads at once (if every source's may)."""
        return all(thread_safe(s) for s in self.sources)

    def __len__(self) -> int:
        """The number of positions of the mixture."""
        self._require()
        assert self._len is not None
        return self._len

    @property
    def fingerprint(self) -> dict[str, Any]:
        """What the mixture's order depends on, which the loader's state carries -- the
        weights (or their stages), the order of passes, and each source's length and
        own fingerprint."""
        fixed = not self.ordered
        out: dict[str, Any] = {
            "weights": self.weights if fixed else self.stages.to_json(),
            "seed": self.seed,
            "shuffle": self.shuffle,
            "sources": [_source_print(s) for s in self.sources],
        }
        if self._sizes_given and self._sizes is not None:
            out["global_batch_size"] = self._sizes.stages.to_json()
        return out

    def weights_at(self, step: int) -> list[float]:
        """Each source's weight at ``step`` (blends included)."""
        i = self.stages.index(step)
        w = np.asarray(self.stages.stages[i].value)
        f = self.stages.fraction(step)
        if f < 1.0:
            w = np.asarray(self.stages.stages[i - 1].value) * (1 - f) + w * f
        return w.tolist()

    def locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source index, example id in that source) of each mixture id."""
        return self._require().locate(np.asarray(ids, dtype=np.int64))

    def __getitem__(self, ids: np.ndarray | int) -> dict[str, Any]:
        """The examples at positions ``ids``, each read from the source that position names."""
        if isinstance(ids, int | np.integer):  # source[i]: one example
            return example_at(self, ids)
        ids = check_ids(ids, len(self), "this mixture")
        which, local = self.locate(ids)
        return gather_by_part(which, local, self.fields, lambda s, rows: self.sources[s][rows])

    def lengths(self, field: str) -> np.ndarray:
        """Every document's length in the ragged ``field``, from each source's lengths."""
        if field not in self.fields or not self.fields[field].ragged:
            raise ValueError(f"lengths({field!r}): that is not a ragged field of this mixture.")
        n = len(self)
        per_source = [document_lengths(s, field) for s in self.sources]
        out = np.empty(n, np.int64)
        for a in range(0, n, BLOCK * 16):  # a chunk at a time: no N-sized ids
            which, local = self.locate(np.arange(a, min(n, a + BLOCK * 16)))
            for s in np.unique(which).tolist():
                where = np.flatnonzero(which == s)
                out[a + where] = per_source[s][local[where]]
        return out

    def __repr__(self) -> str:
        size = f"{self._len} examples" if self._len is not None else "not bound to steps yet"
        if not self.ordered:
            parts = ", ".join(f"{w:.3g}" for w in self.weights)
            return f"Mixture({len(self.sources)} sources, weights [{parts}], {size})"
        return f"Mixture({len(self.sources)} sources, {len(self.stages)} stages, {size})"


def _source_print(source: Source) -> dict[str, Any]:
    inner = getattr(source, "fingerprint", None)
    return {"examples": len(source), **({"source": inner} if inner is not None else {})}


def mix(
    sources: Sequence[Source],
    weights: WeightsArg,
    *,
    length: int | None = None,
    seed: int = 0,
    shuffle: bool = True,
    global_batch_size: BatchSizeArg | None = None,
) -> Mixture:
    """A deterministic, resumable mixture of ``sources`` in proportions ``weights``.

    Args:
      sources: sources with the same fields (names, shapes, dtypes).
      weights: one positive number per source (normalised to sum to 1); or stages, a
        list of ``(start_step, weights)`` -- and ``(start_step, weights, blend_steps)``
        to move there from the stage before by a linear blend over ``blend_steps``
        steps. In a stage a weight may be 0. A mixture with stages is read in step
        order: load it with ``shuffle=False`` (it shuffles inside each source).
      length: positions in the mixture; default the shortest mixture in which every
        example of every source appears at least once.
      seed: the key of the order each source is read in.
      shuffle: read every pass over a source in a new keyed order (of ``seed``, the
        source and the pass); ``False``: each pass in order ``0 .. n-1``.
      global_batch_size: the steps stage starts count, for a mixture with stages that
        no ``Loader`` reads directly (under ``pack``, a step is that many documents);
        an int or ``(start_step, size)`` stages. A loader binds the mixture itself.

    Returns:
      A ``Source``; load it with ``meshfeed.Loader`` like any other.
    """
    if isinstance(sources, Source) or not isinstance(sources, Sequence) or not sources:
        raise TypeError(
            "mix takes a non-empty list of sources, e.g. mix([a, b], weights=[0.7, 0.3])."
        )
    for i, s in enumerate(sources):
        if not isinstance(s, Source):
            raise TypeError(f"sources[{i}] is a {type(s).__name__}, not a meshfeed.Source.")
        if getattr(s, "ordered", False):
            raise ValueError(
                f"sources[{i}] changes its weights by stage and must be read in order; "
                "mix its sources into one mixture with stages instead."
            )
        if len(s) == 0:
            raise ValueError(f"sources[{i}] has no examples.")
    if isinstance(weights, str) or not isinstance(weights, Sequence):
        raise TypeError(f"weights={weights!r} must be a list: one weight per source, or stages.")
    staged = bool(weights) and isinstance(weights[0], tuple | list)
    if not staged and len(weights) != len(sources):
        raise ValueError(f"mix got {len(sources)} sources but {len(weights)} weights.")
    check = _weights(len(sources), stages=staged)
    if staged:
        stages = Stages.parse(weights, name="weights", value=check, example=_EXAMPLE, blends=True)
    else:
        stages = Stages([Stage(0, check(weights, "weights"))])
    first = dict(sources[0].fields)
    for i, s in enumerate(sources[1:], start=1):
        if dict(s.fields) != first:
            raise ValueError(
                f"sources[{i}] has fields {describe(s.fields)}, sources[0] has "
                f"{describe(first)}; every "
                "source of a mixture needs the same fields, shapes and dtypes."
            )
    if length is not None and (not isinstance(length, int) or length < 1):
        raise ValueError(f"length={length!r} must be an int >= 1, or None.")
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed={seed!r} must be an int >= 0.")
    sizes = None if global_batch_size is None else BatchSizes.parse(global_batch_size)
    if sizes is None and len(stages) == 1:
        sizes = BatchSizes.fixed(1)  # fixed weights count no steps
    return Mixture(
        sources,
        stages,
        length=length,
        seed=seed,
        shuffle=bool(shuffle),
        sizes=sizes,
        sizes_given=global_batch_size is not None,
    )
