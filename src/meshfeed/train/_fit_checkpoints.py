"""A training loop's saves: resume from the newest checkpoint, save every so many steps
and after the last, and turn a preemption's notice into one saved step.

``FitCheckpoints`` is what ``fit`` does with ``checkpoint_dir``; without one it does
nothing, so the loop calls it the same way either way. The checkpoint itself (Orbax or
S3, the loader's position beside the state, saves that run on while training goes on)
is ``Checkpoints``; this part decides when to save and when to stop.

With checkpoints, a SIGTERM to any process (a preemption's notice) becomes one step that
every process saves and stops at (``Preemption``); Python lets only the main thread catch
it, so on another thread the loop runs on without that.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from meshfeed.cluster._preemption import Preemption, preemption
from meshfeed.feed._loader import Loader
from meshfeed.train._checkpoint import Checkpoints


class FitCheckpoints:
    """Checkpoints every ``every`` steps in ``directory`` (``None``: none), with the
    loader's position, and a preemption's step saved before the loop stops."""

    def __init__(
        self,
        directory: str | os.PathLike[str] | None,
        every: int | None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.every = every
        self._checkpoints: Checkpoints | None = None
        if directory is not None:
            self._checkpoints = Checkpoints(directory, storage_options=storage_options)
        self._notice: Preemption | None = None
        self._saved: int | None = None  # the last step saved

    @property
    def active(self) -> bool:
        """Whether there is a directory to save in."""
        return self._checkpoints is not None

    def resume(self, state: Any, loader: Loader) -> tuple[Any, int]:
        """The newest checkpoint's state and step, the loader moved to its position;
        ``(state, 0)`` where there is none."""
        if self._checkpoints is None:
            return state, 0
        latest = self._checkpoints.latest_step()
        if latest is None:
            return state, 0
        return self._checkpoints.restore(state, loader), latest

    def catch_preemption(self) -> None:
        """From now on a SIGTERM to any process stops every process at one saved step."""
        if self._checkpoints is None:
            return
        notice = preemption()
        self._notice = notice if notice.install() else None

    def save_if_due(self, step: int, last: int, state: Any, loader: Loader) -> None:
        """Saves ``step`` when one is due: every ``every`` steps, and the ``last``."""
        if self._checkpoints is None:
            return
        assert self.every is not None
        if step % self.every == 0 or step == last:
            self._checkpoints.save(step, state, loader)
            self._saved = step

    def stop_if_preempted(self, step: int, state: Any, loader: Loader) -> None:
        """At a preemption's agreed step (the same on every process), saves it if not yet
        saved, waits for the save, and ends the process (``SystemExit(0)``)."""
        if self._checkpoints is None or self._notice is None or not self._notice.reached(step):
            return
        if self._saved != step:
            self._checkpoints.save(step, state, loader)
        self._checkpoints.close()
        self._notice.stop()

    def close(self) -> None:
        """Waits until the last save is whole; stops catching SIGTERM."""
        if self._checkpoints is not None:
            self._checkpoints.close()
        if self._notice is not None:
            self._notice.uninstall()
