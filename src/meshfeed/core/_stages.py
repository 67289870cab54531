"""Stages: a setting that changes at given steps of a run.

A schedule such as ``[(0, 32), (1000, 64)]`` (a batch size that ramps) or
``[(0, [0.9, 0.1]), (5000, [0.5, 0.5], 500)]`` (mixture weights, the second stage
reached by a linear blend over 500 steps) is a list of stages, each in force from its
start step to the next one's. ``Stages`` checks such a list, says which stage a step is
in, and finds the first step at which two schedules differ: a run restored with a
changed schedule continues when the two agree on every step already taken. Stages that
change nothing (the same value, no blend) merge into the one before, so two ways of
writing the same schedule compare equal. ``BatchSizes`` adds the closed form a loader
needs: the positions (examples) the steps before step ``k`` read, and back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

import numpy as np

V = TypeVar("V")
BatchSizeArg = int | Sequence[tuple[int, int]]
"""A global batch size: rows per step, or stages ``(start_step, rows)``."""


@dataclasses.dataclass(frozen=True)
class Stage(Generic[V]):
    """One stage: its value holds from step ``start`` on (reached by a linear blend over
    the ``blend`` steps from ``start`` when ``blend > 0``)."""

    start: int
    value: V
    blend: int = 0


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Stages(Generic[V]):
    """A checked list of stages (module docstring); build with ``Stages.parse``."""

    def __init__(self, stages: Sequence[Stage[V]]) -> None:
        merged: list[Stage[V]] = []
        for stage in stages:
            if merged and stage.blend == 0 and stage.value == merged[-1].value:
                continue
            merged.append(stage)
        self.stages = tuple(merged)
        self.starts = np.array([s.start for s in self.stages], np.int64)

    @classmethod
    def parse(
        cls,
        given: object,
        *,
        name: str,
        value: Callable[[object, str], V],
        example: str,
        blends: bool = False,
    ) -> Stages[V]:
        """The stages in ``given``, a list of ``(start_step, value)`` tuples (and
        ``(start_step, value, blend_steps)`` where ``blends``); ``value(v, where)``
        checks one value. Raises naming ``name`` and showing ``example`` otherwise."""
        form = "(start_step, value, blend_steps)" if blends else "(start_step, value)"
        if not isinstance(given, Sequence) or isinstance(given, str) or not given:
            raise TypeError(f"{name} must be a non-empty list of {form} stages, e.g. {example}.")
        stages: list[Stage[V]] = []
        for i, item in enumerate(given):
            where = f"{name}[{i}]"
            if not isinstance(item, Sequence) or len(item) not in ((2, 3) if blends else (2,)):
                raise TypeError(f"{where}={item!r} must be a tuple {form}, e.g. {example}.")
            start, raw, blend = item[0], item[1], item[2] if len(item) == 3 else 0
            if not _count(start) or start < 0:
                raise ValueError(f"{where} starts at step {start!r}; a start must be an int >= 0.")
            if i == 0 and start != 0:
                raise ValueError(f"{where} starts at step {start}; the first stage starts at 0.")
            if stages and start <= stages[-1].start:
                raise ValueError(
                    f"{where} starts at step {start}, not after the stage before it "
                    f"(step {stages[-1].start}); list stages in the order they start."
                )
            if not _count(blend) or blend < 0:
                raise ValueError(f"{where} blends over {blend!r} steps; pass an int >= 0.")
            if i == 0 and blend:
                raise ValueError(f"{where} blends from nothing: the first stage has no blend.")
            if stages and stages[-1].start + stages[-1].blend > start:
                before = stages[-1]
                raise ValueError(
                    f"{where} starts at step {start}, inside the blend of the stage before "
                    f"it (steps {before.start} to {before.start + before.blend - 1}); "
                    "start it after the blend ends, or shorten the blend."
                )
            stages.append(Stage(start, value(raw, where), blend))
        return cls(stages)

    def __len__(self) -> int:
        """The number of stages (after merging)."""
        return len(self.stages)

    def __iter__(self) -> Iterator[Stage[V]]:
        """The stages, in the order they start."""
        return iter(self.stages)

    def index(self, step: int) -> int:
        """The stage step ``step`` is in (its number in the list, after merging)."""
        return int(np.searchsorted(self.starts, step, side="right")) - 1

    def fraction(self, step: int) -> float:
        """How far ``step`` is through its stage's blend: 1.0 once the blend is over
        (and in a stage without one)."""
        stage = self.stages[self.index(step)]
        if step >= stage.start + stage.blend:
            return 1.0
        return (step - stage.start + 1) / (stage.blend + 1)

    def to_json(self) -> dict[str, Any]:
        """``{"stages": [[start, value, blend], ...]}``: how a fingerprint carries it."""
        return {"stages": [[s.start, _json(s.value), s.blend] for s in self.stages]}


def _json(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_json(v) for v in value]
    return value


def is_stages(value: object) -> bool:
    """Whether ``value`` is a schedule in a fingerprint (``Stages.to_json``)."""
    return isinstance(value, dict) and list(value) == ["stages"]


def first_difference(a: dict[str, Any], b: dict[str, Any]) -> int | None:
    """The first step at which two schedules (``Stages.to_json``) differ; ``None`` if
    they are the same. Stages are compared whole: a stage that starts, holds or blends
    differently makes its start the first step that differs."""
    left, right = a["stages"], b["stages"]
    for x, y in zip(left, right, strict=False):
        if list(x) != list(y):
            return min(x[0], y[0])
    if len(left) != len(right):
        longer = left if len(left) > len(right) else right
        return longer[min(len(left), len(right))][0]
    return None


def batch_size(value: object, where: str) -> int:
    """A batch size: an int >= 1."""
    if not _count(value):
        raise TypeError(f"{where}: the batch size {value!r} must be an int.")
    if value < 1:  # type: ignore[operator]
        raise ValueError(f"{where}: the batch size {value} must be >= 1.")
    return value  # type: ignore[return-value]


class BatchSizes:
    """Steps and positions under a batch size by stages: step ``k`` reads positions
    ``[position(k), position(k) + size(k))``, right after every earlier step's."""

    def __init__(self, stages: Stages[int]) -> None:
        self.stages = stages
        self.sizes = np.array([s.value for s in stages], np.int64)
        starts = stages.starts
        self._positions = np.zeros(len(starts), np.int64)  # positions before each stage
        if len(starts) > 1:
            np.cumsum(np.diff(starts) * self.sizes[:-1], out=self._positions[1:])

    @classmethod
    def fixed(cls, size: int) -> BatchSizes:
        """One size for every step."""
        return cls(Stages([Stage(0, size)]))

    @classmethod
    def parse(cls, given: BatchSizeArg, name: str = "global_batch_size") -> BatchSizes:
        """An int, or ``(start_step, size)`` stages."""
        if _count(given):
            return cls.fixed(batch_size(given, name))
        example = "[(0, 32), (1000, 64)]"
        return cls(Stages.parse(given, name=name, value=batch_size, example=example))

    @property
    def distinct(self) -> list[int]:
        """Each size the schedule uses, in the order they first appear."""
        return list(dict.fromkeys(self.sizes.tolist()))

    def size(self, step: int) -> int:
        """Rows of step ``step``."""
        return int(self.sizes[self.stages.index(step)])

    def position(self, step: int) -> int:
        """Positions read by the steps before ``step``."""
        i = self.stages.index(step)
        return int(self._positions[i] + (step - self.stages.starts[i]) * self.sizes[i])

    def step_at(self, position: int) -> int:
        """The step that reads ``position``."""
        i = int(np.searchsorted(self._positions, position, side="right")) - 1
        return int(self.stages.starts[i] + (position - self._positions[i]) // self.sizes[i])

    def steps_in(self, positions: int, *, partial: bool) -> int:
        """Steps that read the first ``positions`` positions: whole steps only, or also
        a last ``partial`` one."""
        k = self.step_at(positions)
        return k + int(partial and self.position(k) < positions)
