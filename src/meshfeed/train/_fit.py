"""The fit loop: steps fed by a loader, with progress, metrics, evaluation and saves.

The loop keeps the devices busy without waiting on them: JAX dispatches a step and
returns, so the host reads and places the next batch while the devices compute, and the
loop runs at most two steps ahead of them. It syncs only to log (every ``log_every``
steps) and to evaluate. Each concern is a part of its own, and the loop in the middle
calls them in turn:

- ``InputClock`` (``_input_clock``): times ``next(loader)`` -- the share of wall time the
  devices waited for input, the number that says whether loading keeps up -- and keeps
  the loop at most two steps ahead;
- ``FitCheckpoints`` (``_fit_checkpoints``): resumes, saves, and stops at a
  preemption's saved step;
- ``Evaluations`` (``_evaluate``): when to evaluate, and the evaluation;
- ``FitLog`` (``_fit_log``): a log step's figures, and the user's writer;
- ``FitProgress`` (``_fit_progress``): the bar and the lines process 0 shows.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax

from meshfeed.cluster._initialize import ensure_watched
from meshfeed.cluster._watch import doing
from meshfeed.feed._loader import Loader
from meshfeed.train._evaluate import EvalFn, Evaluations
from meshfeed.train._fit_checkpoints import FitCheckpoints
from meshfeed.train._fit_log import FitLog
from meshfeed.train._fit_progress import FitProgress
from meshfeed.train._input_clock import InputClock, endless
from meshfeed.train._step_parts import Batch
from meshfeed.train._writers import as_writer

__all__ = ["History", "StepFn", "fit"]

StepFn = Callable[[Any, Batch], tuple[Any, Mapping[str, jax.Array]]]
"""A train step: ``step(state, batch) -> (state, metrics)`` (what ``make_train_step`` builds)."""


@dataclasses.dataclass
class History:
    """What ``fit`` did: logged metrics, evaluations, throughput, and the final state."""

    state: Any
    train: list[dict[str, float]] = dataclasses.field(default_factory=list)
    eval: list[dict[str, float]] = dataclasses.field(default_factory=list)
    steps: int = 0
    seconds: float = 0.0
    samples_per_s: float = 0.0
    input_wait_share: float = 0.0
    """Share of wall time the devices sat idle while the loop waited for the next batch:
    time in ``next(loader)`` once the previous step had finished (an upper bound)."""
    loader_share: float = 0.0
    """Share of wall time in ``next(loader)`` at all, including the time the previous
    step was still computing (placing the batch then overlaps it)."""
    prefetch_depth: int | None = None
    """Steps the loader read ahead at the end, which with ``prefetch="auto"`` is the
    depth it settled on (``None`` for a loader that does not say)."""


def fit(
    step: StepFn,
    state: Any,
    loader: Iterable[Batch],
    *,
    num_steps: int | None = None,
    eval_loader: Iterable[Batch] | None = None,
    eval_fn: EvalFn | None = None,
    eval_every: int | None = None,
    log_every: int = 20,
    progress: bool = True,
    description: str = "train",
    checkpoint_dir: str | os.PathLike[str] | None = None,
    checkpoint_every: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    writer: Any = None,
) -> History:
    """Trains ``state`` with ``step`` on the batches of ``loader``.

    Args:
      step: from ``make_train_step``.
      state: from ``TrainState.create``.
      loader: a ``meshfeed.Loader`` (or any iterable of batches). Under a batch size
        that ramps, ``step`` compiles once per size, when it first meets it; each log
        line (and ``History.train``) carries the batch size and mixture stage of its
        step (``"batch_size"``, ``"mix_stage"``).
      num_steps: stop after this many steps (a ``Loader`` runs on into its next pass
        of epochs); default: until the loader's pass ends.
      eval_loader: batches to evaluate on, with ``eval_fn``.
      eval_fn: ``eval_fn(params, batch) -> {name: mean over valid rows}``; when the
        state holds model state (``state.model_state`` is not ``None``),
        ``eval_fn(params, batch, model_state)``.
      eval_every: steps between evaluations; default: each epoch of ``loader`` (when it
        has ``steps_per_epoch``), and always after the last step.
      log_every: steps between logged metrics (each log waits for the devices).
      progress: report on process 0: a progress bar on a terminal, and off one (a log
        file, CI) a line per log and per evaluation. ``False`` prints nothing at all; the
        ``History`` holds every logged figure either way.
      description: the progress bar's label.
      checkpoint_dir: save the state and the loader's position here (Orbax, every
        process together) every ``checkpoint_every`` steps and after the last; on start,
        resume from the newest checkpoint there, if any. ``loader`` must then be a
        ``meshfeed.Loader`` and ``num_steps`` counts the whole run, restarts included,
        so relaunching the same command finishes the same run. A local folder (one every
        process shares), ``gs://BUCKET/PATH`` or ``s3://BUCKET/PATH``. Saves are
        asynchronous: training goes on while one is written, and ``fit`` returns once
        the last is whole. With checkpoints, a SIGTERM to any process (a preemption's
        notice) makes every process save one agreed step and exit with code 0, saying
        which process was told; the same command resumes there.
      checkpoint_every: steps between checkpoints (with ``checkpoint_dir``).
      storage_options: for ``checkpoint_dir`` on ``s3://``: the store's
        ``endpoint_url`` (and ``client_kwargs={"region_name": ...}``), as for data URLs.
      writer: where process 0 writes each log step's figures and each evaluation: an
        object with ``write_scalars(step, scalars)`` (CLU), ``add_scalar(tag, value,
        step)`` (a tensorboardX or PyTorch ``SummaryWriter``) or ``log(data, step=)`` (a
        W&B run). Tags: ``train/loss`` and the step's other metrics, ``input/wait_share``,
        ``input/records_per_s``, ``input/prefetch_depth``, ``input/skipped``,
        ``input/filtered``, from a ``Loader``'s ``stats()``
        ``input/source_ms_per_step`` (and ``record_transform_``,
        ``transform_``, ``place_``) and ``input/read_ahead_fill``, with several processes
        ``input/wait_share_min``, ``_median``, ``_max`` and
        ``input/slowest_process``, and ``eval/<name>``. Several processes always gather
        their input waits at log steps (the log line names the slowest).

    Returns:
      A ``History``; ``history.state`` is the trained state.
    """
    _check_arguments(loader, num_steps, checkpoint_dir, checkpoint_every, log_every)
    if (eval_loader is None) != (eval_fn is None):
        raise ValueError("pass eval_loader and eval_fn together, or neither.")
    if writer is not None:
        as_writer(writer)  # an object that writes nothing is refused before anything runs
    # Every argument is checked: only now touch the checkpoint directory.
    saves = FitCheckpoints(checkpoint_dir, checkpoint_every, storage_options)
    state, done = saves.resume(state, loader)  # type: ignore[arg-type]
    if saves.active and num_steps is not None:
        total = num_steps  # the whole run's
    else:
        total = done + _total_steps(loader, num_steps)
    feed = loader if isinstance(loader, Loader) else None  # what a Loader tells the loop
    every = eval_every or (feed.steps_per_epoch if feed is not None else None) or total
    evaluations = Evaluations(eval_fn, eval_loader, every, total)
    ensure_watched()  # a job connected by jax.distributed.initialize itself
    saves.catch_preemption()
    show = progress and jax.process_index() == 0
    history = History(state=state, steps=done)
    batches = endless(loader)
    with FitProgress(description, total, done, show=show) as shown, FitLog(feed, writer) as log:
        clock = InputClock()
        for k in range(done + 1, total + 1):
            try:
                batch = clock.next(batches)
            except StopIteration:
                break
            doing(f"training step {k}")
            state, metrics = clock.dispatch(step, state, batch)
            history.steps = k
            shown.stepped(k)
            saves.save_if_due(k, total, state, loader)  # type: ignore[arg-type]
            if k % log_every == 0 or k == total:
                logged, info = log.figures(k, metrics, clock)
                history.train.append(logged)
                shown.logged(k, info)
            if evaluations.due(k):
                result = evaluations.run(k, state)
                history.eval.append(result)
                log.evaluated(k, result)
                shown.evaluated(k, result)
            saves.stop_if_preempted(k, state, loader)  # type: ignore[arg-type]
        jax.block_until_ready(state)
    log.close()
    saves.close()  # the last save whole before fit returns
    return _finished(history, state, clock, feed)


def _check_arguments(
    loader: Iterable[Batch],
    num_steps: int | None,
    checkpoint_dir: str | os.PathLike[str] | None,
    checkpoint_every: int | None,
    log_every: int,
) -> None:
    if checkpoint_dir is not None:
        if not isinstance(loader, Loader):
            raise TypeError(
                f"checkpoint_dir needs a meshfeed.Loader to resume exactly; got "
                f"{type(loader).__name__}."
            )
        if not isinstance(checkpoint_every, int) or checkpoint_every < 1:
            raise ValueError(
                f"checkpoint_every={checkpoint_every!r} must be an int >= 1 with checkpoint_dir."
            )
    elif checkpoint_every is not None:
        raise ValueError("checkpoint_every needs checkpoint_dir (where to save).")
    if num_steps is not None and (not isinstance(num_steps, int) or num_steps < 1):
        raise ValueError(f"num_steps={num_steps!r} must be an int >= 1, or None.")
    if num_steps is None:
        _length(loader)
    if log_every < 1:
        raise ValueError(f"log_every={log_every} must be >= 1.")


def _finished(history: History, state: Any, clock: InputClock, feed: Loader | None) -> History:
    """``history`` with the run's figures and final ``state``."""
    history.seconds = clock.elapsed
    shares = clock.shares(history.seconds)
    history.samples_per_s = shares["samples_per_s"]
    history.input_wait_share = shares["input_wait_share"]
    history.loader_share = shares["loader_share"]
    history.prefetch_depth = feed.prefetch_depth if feed is not None else None
    history.state = state
    return history


def _total_steps(loader: Iterable[Batch], num_steps: int | None) -> int:
    if num_steps is not None:
        return num_steps
    length = _length(loader)  # a Loader's pass: at its end, a loop runs the next one
    remaining = length - (loader.step if isinstance(loader, Loader) else 0) % length
    if remaining < 1:
        raise ValueError(
            "the loader has no steps left; call loader.reset() or restore an earlier state."
        )
    return remaining


def _length(loader: Iterable[Batch]) -> int:
    try:
        return len(loader)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(
            "the loader is endless (or has no len()); pass num_steps= to say when to stop."
        ) from None
