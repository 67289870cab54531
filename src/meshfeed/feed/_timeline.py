"""What holds at each step: the batch size and a mixture's weights, stage by stage.

A loader follows up to two schedules: its batch size by stages, and the weights of a
mixture it reads directly. ``Timeline`` says what holds at a step (``at``: the size, the
stage of each, the weights there, blends included) and cuts the steps ahead into spans
where nothing changes (``spans``), for ``show_plan``, ``fit``'s log and
``plot_mixture``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from meshfeed.core._stages import BatchSizes


def weights_text(weights: tuple[float, ...]) -> str:
    """``0.80/0.20``: weights as the log and the plan print them."""
    return "/".join(f"{w:.2f}" for w in weights)


@dataclasses.dataclass(frozen=True)
class StepStage:
    """What holds at one step: the batch size and its stage, and for a mixture with
    stages, its stage and each source's weight there (mid-blend: the blended ones)."""

    step: int
    batch_size: int
    batch_stage: int
    mix_stage: int | None = None
    weights: tuple[float, ...] | None = None
    blending: bool = False

    def __str__(self) -> str:
        text = f"batch {self.batch_size}"
        if self.mix_stage is not None and self.weights is not None:
            shares = weights_text(self.weights)
            text += f"  mix stage {self.mix_stage}"
            text += f" (blending, {shares})" if self.blending else f" ({shares})"
        return text


@dataclasses.dataclass(frozen=True)
class Span:
    """Steps ``first`` to ``last`` (inclusive; ``None``: endless) over which the batch
    size and the mixture's stage stay the same. In a stage reached by a blend, the
    weights move from ``blend_from`` to ``weights`` over the steps ``blend_steps``."""

    first: int
    last: int | None
    batch_size: int
    mix_stage: int | None = None
    weights: tuple[float, ...] | None = None
    blend_from: tuple[float, ...] | None = None
    blend_steps: tuple[int, int] | None = None


class Timeline:
    """The stages of a loader's batch size and of the mixture it reads (if scheduled)."""

    def __init__(self, sizes: BatchSizes, mixture: Any, end: int | None) -> None:
        self.sizes = sizes
        self.end = end
        self.mixture = mixture if getattr(mixture, "ordered", False) else None
        self.staged = len(sizes.stages) > 1 or self.mixture is not None
        """Whether anything changes by stage."""

    def at(self, step: int) -> StepStage:
        """What holds at ``step``."""
        batch = StepStage(step, self.sizes.size(step), self.sizes.stages.index(step))
        if self.mixture is None:
            return batch
        stages = self.mixture.stages
        weights = _rounded(self.mixture.weights_at(step))
        return dataclasses.replace(
            batch,
            mix_stage=stages.index(step),
            weights=weights,
            blending=stages.fraction(step) < 1.0,
        )

    def _breaks(self) -> list[int]:
        """Steps at which something changes."""
        breaks = set(self.sizes.stages.starts.tolist())
        if self.mixture is not None:
            for stage in self.mixture.stages:
                breaks.update((stage.start, stage.start + stage.blend))
        return sorted(breaks)

    def spans(self, first: int, count: int = 8) -> list[Span]:
        """Up to ``count`` spans from step ``first`` on (to the end of the run)."""
        if self.end is not None and first >= self.end:
            return []
        out: list[Span] = []
        start = first
        for stop in [*(b for b in self._breaks() if b > first), None]:
            if self.end is not None and (stop is None or stop >= self.end):
                stop = self.end
            out.append(self._span(start, None if stop is None else stop - 1))
            if stop is None or stop == self.end or len(out) == count:
                break
            start = stop
        return out

    def _span(self, first: int, last: int | None) -> Span:
        span = Span(first, last, self.sizes.size(first))
        if self.mixture is None:
            return span
        stages = self.mixture.stages
        i = stages.index(first)
        stage = stages.stages[i]
        span = dataclasses.replace(span, mix_stage=i, weights=_rounded(stage.value))
        if stage.blend and first < stage.start + stage.blend:
            return dataclasses.replace(
                span,
                blend_from=_rounded(stages.stages[i - 1].value),
                blend_steps=(stage.start, stage.start + stage.blend - 1),
            )
        return span


def _rounded(weights: Any) -> tuple[float, ...]:
    return tuple(round(float(w), 6) for w in weights)
