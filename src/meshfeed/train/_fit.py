"""The fit loop: steps fed by a loader, with progress, metrics and evaluation.

The loop keeps the devices busy without waiting on them: JAX dispatches a step and
returns, so the host reads and places the next batch while the devices compute, and the
loop runs at most two steps ahead of them. It syncs only to
log (every ``log_every`` steps) and to evaluate. The progress bar shows the share of
wall time the devices waited for input -- the number that says whether loading keeps
up. That is time spent in ``next(loader)`` after the previous step had finished
(``jax.Array.is_ready``); time in ``next`` while that step still computes overlaps it
and is reported apart, as ``History.loader_share``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from meshfeed.cluster._initialize import ensure_watched
from meshfeed.cluster._preemption import preemption
from meshfeed.cluster._watch import activity, doing
from meshfeed.feed._loader import Loader
from meshfeed.train._checkpoint import Checkpoints
from meshfeed.train._step_parts import Batch, valid_rows
from meshfeed.train._train_state import TrainState
from meshfeed.train._writers import (
    Background,
    as_writer,
    slowest_text,
    stage_figures,
    stopped_on_error,
    train_tags,
    waits_across,
)

EvalFn = Callable[..., Mapping[str, jax.Array]]
"""``eval_fn(params, batch) -> {name: mean over the valid rows}``; with model state,
``eval_fn(params, batch, model_state)``."""
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
    if (eval_loader is None) != (eval_fn is None):
        raise ValueError("pass eval_loader and eval_fn together, or neither.")
    if writer is not None:
        as_writer(writer)  # an object that writes nothing is refused before anything runs
    # Every argument is checked: only now touch the checkpoint directory.
    checkpoints, done = None, 0
    if checkpoint_dir is not None:
        checkpoints = Checkpoints(checkpoint_dir, storage_options=storage_options)
        latest = checkpoints.latest_step()
        if latest is not None:
            state = checkpoints.restore(state, loader)  # type: ignore[arg-type]
            done = latest
    if checkpoints is not None and num_steps is not None:
        total = num_steps  # the whole run's
    else:
        total = done + _total_steps(loader, num_steps)
    feed = loader if isinstance(loader, Loader) else None  # what a Loader tells the loop
    every: int = eval_every or (feed.steps_per_epoch if feed is not None else None) or total
    evaluate = None if eval_fn is None or eval_loader is None else evaluator(eval_fn)
    stage_of: Callable[[int], Any] | None = feed.stage if feed is not None else None

    ensure_watched()  # a job connected by jax.distributed.initialize itself
    # With checkpoints, a SIGTERM (a preemption's notice) becomes one step every process
    # saves and stops at; on a thread other than the main one it cannot be caught.
    notice = preemption() if checkpoints is not None else None
    if notice is not None and not notice.install():
        notice = None
    history = History(state=state, steps=done)
    show = progress and jax.process_index() == 0
    # One writer's figures, process 0's (with every process's wait), on a thread.
    write = Background(writer) if writer is not None and jax.process_index() == 0 else None
    console = Console(file=sys.stdout)
    # Off a terminal (CI logs, pipes) a bar cannot redraw: print a line per log instead.
    bar = Progress(
        TextColumn(f"[bold]{description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=console,
        disable=not (show and console.is_terminal),
    )
    iterator = iter(loader)
    stats_of: Callable[[], dict[str, Any]] | None = feed.stats if feed is not None else None
    stats_before = stats_of() if callable(stats_of) else {}  # a Loader's, stage by stage
    wait = in_loader = 0.0
    previous: Any = None  # an output of the last step (is_ready is on concrete arrays)
    in_flight: Any = None  # an output of the step before it
    start = time.perf_counter()
    metrics: Mapping[str, jax.Array] = {}
    rows = 0
    with bar, stopped_on_error(write):  # a run that raises ends the writer's thread too
        task = bar.add_task("train", total=total, completed=done, info="")
        for k in range(done + 1, total + 1):
            t = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                if not isinstance(loader, Loader):
                    break
                iterator = iter(loader)  # num_steps past the pass: the next epochs
                batch = next(iterator)
            spent = time.perf_counter() - t
            in_loader += spent
            # While the previous step still computes, loading overlaps it: no one waits.
            if previous is None or previous.is_ready():
                wait += spent
            rows += len(next(iter(batch.values())))  # a ramp changes it by stage
            if in_flight is not None:
                # At most two steps queued on the devices. With more, XLA:CPU's
                # all-reduce on 8 CPU devices of a busy 2-core host sometimes never
                # gathered its participants (a rendezvous abort after 40 s, with or
                # without a loader thread); with two, none in 120 loaded runs.
                in_flight.block_until_ready()
            doing(f"training step {k}")
            state, metrics = step(state, batch)
            in_flight, previous = previous, _an_output(metrics, state)
            history.steps = k
            bar.update(task, completed=k)  # a terminal's bar moves every step
            due = checkpoints is not None and (k % checkpoint_every == 0 or k == total)  # type: ignore[operator]
            if due:
                checkpoints.save(k, state, loader)  # type: ignore[union-attr, arg-type]
            if k % log_every == 0 or k == total:
                logged = {"step": float(k), **_floats(metrics)}
                elapsed = time.perf_counter() - start
                logged["samples_per_s"] = rows / elapsed
                logged["input_wait_share"] = wait / elapsed
                history.train.append(logged)
                waits = waits_across(logged["input_wait_share"])
                logged.update(waits)
                info = (
                    f"loss {logged['loss']:.4f}  {logged['samples_per_s']:,.0f} samples/s  "
                    f"input wait {100 * logged['input_wait_share']:.1f}%{slowest_text(waits)}"
                )
                if callable(stage_of):
                    here = stage_of(k - 1)
                    logged["batch_size"] = float(here.batch_size)
                    if here.mix_stage is not None:
                        logged["mix_stage"] = float(here.mix_stage)
                    info += f"  {here}"
                depth = feed.prefetch_depth if feed is not None else None
                if depth is not None:
                    logged["prefetch_depth"] = float(depth)
                    info += f"  read-ahead {depth}"
                if callable(stats_of):
                    stats_now = stats_of()
                    logged.update(stage_figures(stats_now, stats_before))
                    stats_before = stats_now
                skipped = feed.skipped if feed is not None else None  # on_error="skip"
                if skipped:
                    logged["skipped"] = float(len(skipped))
                    info += f"  skipped {len(skipped)}"
                filtered = feed.filtered if feed is not None else 0  # record_transform -> None
                if filtered:
                    logged["filtered"] = float(filtered)
                    info += f"  filtered {filtered}"
                bar.update(task, completed=k, info=info)
                if write is not None:
                    write(k, train_tags(logged))
                if show and not console.is_terminal:
                    console.print(f"{description}: step {k}/{total}  {info}", soft_wrap=True)
            if evaluate is not None and eval_loader is not None and (k % every == 0 or k == total):
                with activity(f"evaluating at step {k}"):
                    result = {"step": float(k), **evaluate(state, eval_loader)}
                history.eval.append(result)
                if write is not None:
                    write(k, {f"eval/{n}": v for n, v in result.items() if n != "step"})
                if show:
                    bar.console.print(
                        f"eval at step {k}: "
                        + "  ".join(f"{n} {v:.4f}" for n, v in result.items() if n != "step")
                    )
            if notice is not None and notice.reached(k):  # preempted: every process stops at k
                if not due:
                    checkpoints.save(k, state, loader)  # type: ignore[union-attr, arg-type]
                checkpoints.close()  # type: ignore[union-attr]
                notice.stop()
        jax.block_until_ready(state)
    if write is not None:
        write.close()
    if checkpoints is not None:
        checkpoints.close()  # the last save whole before fit returns
    if notice is not None:
        notice.uninstall()
    history.seconds = time.perf_counter() - start
    history.samples_per_s = rows / history.seconds if history.seconds else 0.0
    history.input_wait_share = wait / history.seconds if history.seconds else 0.0
    history.loader_share = in_loader / history.seconds if history.seconds else 0.0
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


def _floats(metrics: Mapping[str, jax.Array]) -> dict[str, float]:
    return {name: float(value) for name, value in metrics.items()}


def evaluator(eval_fn: EvalFn) -> Callable[[Any, Iterable[Batch]], dict[str, float]]:
    """``evaluate(state, batches)``: each of ``eval_fn``'s values, its mean over every
    valid row of ``batches`` (a Loader starts over first)."""
    compiled: dict[Any, Any] = {}

    def run(state: Any, batches: Iterable[Batch]) -> dict[str, float]:
        model_state = state.model_state if isinstance(state, TrainState) else None
        args = (state.params,) if model_state is None else (state.params, model_state)
        if isinstance(batches, Loader):  # evaluated whole each time
            batches.reset()
        sums: dict[str, float] = {}
        count = 0.0
        for batch in batches:
            mesh = next(iter(batch.values())).sharding.mesh  # type: ignore[attr-defined]
            if mesh not in compiled:
                replicated = NamedSharding(mesh, P())

                def one(a: tuple[Any, ...], b: Batch) -> tuple[Any, jax.Array]:
                    n = valid_rows(b)
                    return {k: jnp.asarray(v) * n for k, v in eval_fn(a[0], b, *a[1:]).items()}, n

                compiled[mesh] = jax.jit(one, out_shardings=replicated)
            weighted, n = compiled[mesh](args, batch)
            for name, value in _floats(weighted).items():
                sums[name] = sums.get(name, 0.0) + value
            count += float(n)
        return {name: value / max(count, 1.0) for name, value in sums.items()}

    return run


def _an_output(metrics: Mapping[str, Any], state: Any) -> Any:
    """One array the step produced, to ask later whether the step has finished."""
    for leaf in jax.tree_util.tree_leaves((metrics, state)):
        if isinstance(leaf, jax.Array):
            return leaf
    return None
