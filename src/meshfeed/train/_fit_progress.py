"""What a training loop shows on process 0: a progress bar on a terminal, a line per log
step and per evaluation off one.

Off a terminal (CI logs, pipes) a bar cannot redraw, so each log step prints its line
instead; evaluations print a line either way. ``show=False`` prints nothing at all.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class FitProgress:
    """A loop's progress from step ``done`` to ``total``; a context manager around the
    loop (the bar redraws while inside)."""

    def __init__(self, description: str, total: int, done: int, *, show: bool) -> None:
        self.description = description
        self.total = total
        self._show = show
        self._console = Console(file=sys.stdout)
        self._bar = Progress(
            TextColumn(f"[bold]{description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=self._console,
            disable=not (show and self._console.is_terminal),
        )
        self._task = self._bar.add_task("train", total=total, completed=done, info="")

    def __enter__(self) -> FitProgress:
        self._bar.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._bar.__exit__(kind, error, traceback)

    def stepped(self, step: int) -> None:
        """A terminal's bar moves every step."""
        self._bar.update(self._task, completed=step)

    def logged(self, step: int, info: str) -> None:
        """A log step's line: beside the bar, or printed off a terminal."""
        self._bar.update(self._task, completed=step, info=info)
        if self._show and not self._console.is_terminal:
            text = f"{self.description}: step {step}/{self.total}  {info}"
            self._console.print(text, soft_wrap=True)

    def evaluated(self, step: int, result: Mapping[str, float]) -> None:
        if self._show:
            figures = "  ".join(f"{n} {v:.4f}" for n, v in result.items() if n != "step")
            self._bar.console.print(f"eval at step {step}: {figures}")
