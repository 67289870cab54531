"""A training loop's log steps: the figures of a step, of its input and of the loader,
and where they are written.

At a log step (every ``log_every`` steps, and the last) the loop waits for the devices
and ``FitLog.figures`` gathers: the step's metrics, rows a second and the input wait so
far (the ``InputClock``), every process's wait with several processes (a collective: all
of them log at the same steps), and what a ``Loader`` says of itself -- the batch size
and mixture stage of the step, the read-ahead depth, each stage's milliseconds a step
since the last log, the records skipped and filtered. Process 0 writes them to the
user's writer on a thread of their own (``Background``), evaluations too.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Any

import jax

from meshfeed.feed._loader import Loader
from meshfeed.train._evaluate import floats
from meshfeed.train._input_clock import InputClock
from meshfeed.train._writers import (
    Background,
    slowest_text,
    stage_figures,
    train_tags,
    waits_across,
)


class FitLog:
    """Log steps' figures for a loop over ``feed`` (a ``Loader``, or ``None`` for any
    other iterable), written to ``writer`` (``None``: nowhere) on process 0; a context
    manager around the loop (a run that raises ends the writer's thread too)."""

    def __init__(self, feed: Loader | None, writer: Any) -> None:
        self._feed = feed
        self._stats_before: dict[str, Any] = feed.stats() if feed is not None else {}
        self._write: Background | None = None
        if writer is not None and jax.process_index() == 0:
            self._write = Background(writer)  # one writer's figures, on a thread

    def __enter__(self) -> FitLog:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if error is not None and self._write is not None:
            self._write.stop()  # a thread left waiting would outlive the run

    def figures(
        self, step: int, metrics: Mapping[str, jax.Array], clock: InputClock
    ) -> tuple[dict[str, float], str]:
        """The log step's figures (``History.train``'s entry) and its line's text."""
        logged = {"step": float(step), **floats(metrics)}
        shares = clock.shares(clock.elapsed)
        logged["samples_per_s"] = shares["samples_per_s"]
        logged["input_wait_share"] = shares["input_wait_share"]
        waits = waits_across(logged["input_wait_share"])
        logged.update(waits)
        info = (
            f"loss {logged['loss']:.4f}  {logged['samples_per_s']:,.0f} samples/s  "
            f"input wait {100 * logged['input_wait_share']:.1f}%{slowest_text(waits)}"
        )
        if self._feed is not None:
            info += self._loader_figures(step, logged)
        if self._write is not None:
            self._write(step, train_tags(logged))
        return logged, info

    def _loader_figures(self, step: int, logged: dict[str, float]) -> str:
        """What the ``Loader`` says of itself, into ``logged``; its part of the line."""
        feed = self._feed
        assert feed is not None
        here = feed.stage(step - 1)
        logged["batch_size"] = float(here.batch_size)
        if here.mix_stage is not None:
            logged["mix_stage"] = float(here.mix_stage)
        info = f"  {here}"
        depth = feed.prefetch_depth
        if depth is not None:
            logged["prefetch_depth"] = float(depth)
            info += f"  read-ahead {depth}"
        stats_now = feed.stats()
        logged.update(stage_figures(stats_now, self._stats_before))
        self._stats_before = stats_now
        skipped = feed.skipped  # on_error="skip"
        if skipped:
            logged["skipped"] = float(len(skipped))
            info += f"  skipped {len(skipped)}"
        filtered = feed.filtered  # record_transform -> None
        if filtered:
            logged["filtered"] = float(filtered)
            info += f"  filtered {filtered}"
        return info

    def evaluated(self, step: int, result: Mapping[str, float]) -> None:
        """An evaluation's figures, written as ``eval/<name>``."""
        if self._write is not None:
            self._write(step, {f"eval/{n}": v for n, v in result.items() if n != "step"})

    def close(self) -> None:
        """Waits until the writer has every figure (raises if it failed)."""
        if self._write is not None:
            self._write.close()
