"""Where ``fit`` writes its figures: the metric writers users already have, found by
duck typing, and every process's input wait.

``as_writer(obj)`` takes an object with ``write_scalars(step, scalars)`` (CLU's
``MetricWriter``), ``add_scalar(tag, value, step)`` (tensorboardX's and PyTorch's
``SummaryWriter``) or ``log(data, step=...)`` (a Weights & Biases run), and returns one
function ``write(step, scalars)`` for all three; nothing of theirs is imported. The tags
are stable (``TAGS``): the step's metrics under ``train/``, the input pipeline's under
``input/``, evaluations under ``eval/``.

``waits_across(share)`` gathers each process's input wait share (one small collective,
every process calling it at the same step) for the min, median and max, and which
process waited most.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

Write = Callable[[int, Mapping[str, float]], None]

TAGS = {
    "samples_per_s": "input/records_per_s",
    "input_wait_share": "input/wait_share",
    "prefetch_depth": "input/prefetch_depth",
    "skipped": "input/skipped",
    "filtered": "input/filtered",
    "input_wait_min": "input/wait_share_min",
    "input_wait_median": "input/wait_share_median",
    "input_wait_max": "input/wait_share_max",
    "slowest_process": "input/slowest_process",
    "source_ms_per_step": "input/source_ms_per_step",
    "record_transform_ms_per_step": "input/record_transform_ms_per_step",
    "transform_ms_per_step": "input/transform_ms_per_step",
    "place_ms_per_step": "input/place_ms_per_step",
    "read_ahead_fill": "input/read_ahead_fill",
}
"""``History.train``'s names -> their tags; every other figure of a log step (``loss``,
the step's metrics, ``batch_size``, ``mix_stage``) is ``train/<name>``."""


def as_writer(obj: Any) -> Write:
    """``write(step, scalars)`` onto ``obj``, whichever of the three kinds it is."""
    if callable(getattr(obj, "write_scalars", None)):
        return lambda step, scalars: obj.write_scalars(step, dict(scalars))
    if callable(getattr(obj, "add_scalar", None)):

        def add(step: int, scalars: Mapping[str, float]) -> None:
            for tag, value in scalars.items():
                obj.add_scalar(tag, value, step)

        return add
    if callable(getattr(obj, "log", None)):
        return lambda step, scalars: obj.log(dict(scalars), step=step)
    raise TypeError(
        f"writer={obj!r} has none of write_scalars(step, scalars) (CLU's MetricWriter), "
        "add_scalar(tag, value, step) (tensorboardX's or PyTorch's SummaryWriter) or "
        "log(data, step=) (a Weights & Biases run)."
    )


class Background:
    """``write`` on a thread of its own, so a writer's work (protobufs, files, a
    network) overlaps the next steps instead of holding the loop up; ``close`` waits
    for every figure handed over, flushes the writer, and raises its error, if any."""

    def __init__(self, obj: Any) -> None:
        self._obj, self._write = obj, as_writer(obj)
        self._queue: queue.SimpleQueue[tuple[int, dict[str, float]] | None] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="meshfeed-writer", daemon=True)
        self._thread.start()

    def __call__(self, step: int, scalars: Mapping[str, float]) -> None:
        if self._error is not None:
            raise RuntimeError(f"the writer failed: {self._error!r}") from self._error
        self._queue.put((step, dict(scalars)))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if self._error is None:
                try:
                    self._write(*item)
                except BaseException as error:  # said on the loop's next write, or at close
                    self._error = error

    def stop(self) -> None:
        """Writes what was handed over and ends the thread, raising nothing (the run is
        ending with an error of its own)."""
        self._queue.put(None)
        self._thread.join()

    def close(self) -> None:
        self.stop()
        if self._error is not None:
            raise RuntimeError(f"the writer failed: {self._error!r}") from self._error
        done = getattr(self._obj, "flush", None)
        if callable(done):
            done()


def stage_figures(now: Mapping[str, Any], before: Mapping[str, Any]) -> dict[str, float]:
    """Each stage's milliseconds a step between two of a loader's ``stats()`` (the
    source's, the record transform's and the batch transform's summed over their threads
    or workers; the placing), and the read-ahead's fill so far."""
    steps = now["steps"] - before.get("steps", 0)
    if steps <= 0:
        return {}
    out: dict[str, float] = {}
    for stage in ("source", "record_transform", "transform", "place"):
        if now.get(stage):
            spent = now[stage]["seconds"] - (before.get(stage) or {}).get("seconds", 0.0)
            out[f"{stage}_ms_per_step"] = 1000.0 * spent / steps
    fill = now["consumer"]["read_ahead"]["fill"]
    if fill is not None:
        out["read_ahead_fill"] = float(fill)
    return out


def train_tags(logged: Mapping[str, float]) -> dict[str, float]:
    """A log step's figures under their tags (``TAGS``; the step itself left out)."""
    return {TAGS.get(k, f"train/{k}"): float(v) for k, v in logged.items() if k != "step"}


def waits_across(share: float) -> dict[str, float]:
    """Every process's input wait share (a collective: all processes call it at the same
    step): min, median, max and the process of the max. Nothing on one process."""
    if jax.process_count() == 1:
        return {}
    from jax.experimental import multihost_utils

    shares = np.asarray(multihost_utils.process_allgather(np.asarray([share], np.float32)))
    shares = shares.reshape(-1).astype(float)
    return {
        "input_wait_min": float(shares.min()),
        "input_wait_median": float(np.median(shares)),
        "input_wait_max": float(shares.max()),
        "slowest_process": float(int(shares.argmax())),
    }


def slowest_text(waits: Mapping[str, float]) -> str:
    """`` (max 4.1% on process 5)`` when one process waits clearly more than the
    median (by half a point and by half again), else nothing."""
    if not waits:
        return ""
    top, middle = waits["input_wait_max"], waits["input_wait_median"]
    if top - middle < 0.005 or top < 1.5 * middle:
        return ""
    return f" (max {100 * top:.1f}% on process {int(waits['slowest_process'])})"
