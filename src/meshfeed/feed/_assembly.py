"""The loader's parts, built from its checked options: schedule, plan, strategy, reader.

``assemble`` wires the pieces in the order a batch meets them -- the ``Schedule`` gives
each step's example ids, the planner picks the strategy (``"auto"`` included), the
strategy's ``Builder`` says which rows this process reads and places them, the
``StepReader`` reads and transforms those rows, and the ``Stream`` reads steps ahead and
hands them out -- so that ``Loader`` is only the façade users see. Nothing here starts a
thread: the workers of a record transform start on the first read.

Everything that depends on the batch size -- where each field's rows sit, which rows this
process reads, the plan -- is a ``Lane``, one per size, so a batch size that ramps
switches lanes at its stage starts and nothing is recomputed per step.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
from jax.sharding import NamedSharding

from meshfeed.core._mesh import num_batch_shards
from meshfeed.data._sources import BalancedSteps, FieldSpec, PartialRows, Source
from meshfeed.feed._balanced import BalancedSchedule, step_rows
from meshfeed.feed._options import AUTO_PLACE_THREADS, LoaderOptions
from meshfeed.feed._pipeline import MAX_DEPTH
from meshfeed.feed._plan import Fetches, Field, Plan, make_plan
from meshfeed.feed._reader import HostStep, Lane, PendingStep, StepReader, make_reader
from meshfeed.feed._schedule import RampSchedule, Schedule
from meshfeed.feed._shardings import (
    FieldShardings,
    SequenceCut,
    ShardingArg,
    fit_to_rank,
    load_shardings,
    sequence_cut,
)
from meshfeed.feed._skips import SkipLog, Skipped
from meshfeed.feed._source_rows import SourceRows
from meshfeed.feed._stats import PipelineStats
from meshfeed.feed._strategies import BUILDERS
from meshfeed.feed._stream import GlobalBatch, Stream
from meshfeed.feed._timeline import StepStage, Timeline


@dataclasses.dataclass
class Assembly:
    """A loader's working parts (``assemble``)."""

    schedule: Schedule | RampSchedule
    end: int | None
    """The step after the last one (``None``: endless)."""
    lanes: dict[int, Lane]
    """Per batch size: where the fields go and which rows this process reads."""
    plans: dict[int, Plan]
    reader: StepReader
    stream: Stream
    timeline: Timeline
    stats: PipelineStats
    _fetches: list[Fetches] = dataclasses.field(default_factory=list)  # sampled once
    pass_steps: int | None = dataclasses.field(init=False)
    """Steps of one pass, ``num_epochs`` epochs (``None``: endless)."""

    def __post_init__(self) -> None:
        self.pass_steps = self.end

    def loop(self) -> Iterator[GlobalBatch]:
        """Batches from the stream's step to the end of its pass; a loop begun where a
        pass ended runs the next (the epoch loop), where epochs line up with steps."""
        if self.stream.closed:
            raise RuntimeError(
                "the loader is closed (close(), or the end of its `with` block); build a "
                "new Loader, and restore(state) to continue where this one was."
            )
        step = self.stream.step
        end = self.end
        size = self.pass_steps
        if end is not None and size is not None and step >= end:
            if self.schedule.steps_per_epoch is None:
                raise RuntimeError(
                    f"the loader's epochs ended at step {end}, and under a batch size that "
                    "ramps a next pass has no whole epochs to give; pass num_epochs with "
                    "every epoch the run needs (or None: endless)."
                )
            self.run_to(step + size)
        return iter(self.stream)

    def pass_end(self, step: int) -> int | None:
        """The end of the pass ``step`` is in (a step at a pass's end: that pass's end);
        under a ramp, only the first pass's."""
        size = self.pass_steps
        if size is None or self.schedule.steps_per_epoch is None:
            return size
        return max(1, -(-step // size)) * size

    def run_to(self, end: int | None) -> None:
        """Runs on to step ``end``: another pass of the epochs (fixed-size steps only,
        whose epochs line up with steps: the schedule of a later epoch is its own)."""
        self.end = self.stream.end = self.timeline.end = end

    def lane(self, step: int) -> Lane:
        """The lane of ``step``'s batch size."""
        return self.lanes[self.schedule.size(step)]

    def process_ids(self, step: int) -> np.ndarray | None:
        """The example ids this process reads for ``step`` (no padding); None past the end."""
        if self.end is not None and step >= self.end:
            return None
        ids = np.concatenate([self.schedule.ids(step)[rows] for rows in self.lane(step).row_sets])
        return ids[ids >= 0]

    def plan_at(self, step: int, source: Source) -> Plan:
        """The plan of ``step``'s batch size; for a source behind a URL, what the next
        steps fetch; with stages, the spans of steps from ``step`` on."""
        plan = self.plans[self.schedule.size(step)]
        fetches = getattr(source, "fetches", None)
        if not self._fetches and getattr(source, "remote", False) and callable(fetches):
            ids = [self.process_ids(k) for k in range(step, step + 8)]
            per_step = [fetches(i) for i in ids if i is not None]
            self._fetches.append(Fetches.sample(source.name, per_step))  # type: ignore[attr-defined]
        staged = self.timeline.staged
        return dataclasses.replace(
            plan,
            fetches=self._fetches[0] if self._fetches else None,
            schedule=tuple(self.timeline.spans(step)) if staged else (),
        )


class AssemblyViews:
    """The loader's read-only views of its parts (its position, schedule, read-ahead and
    skipped examples), apart from the façade's own methods."""

    _parts: Assembly

    @property
    def steps_per_epoch(self) -> int | None:
        """Steps in one pass over the source (``last_batch``'s rule); ``None`` for a ramp."""
        return self._parts.schedule.steps_per_epoch

    def batch_size(self, step: int) -> int:
        """Rows of global step ``step``."""
        return self._parts.schedule.size(step)

    def stage(self, step: int) -> StepStage:
        """What holds at ``step``: the batch size, and a mixture's stage and weights."""
        return self._parts.timeline.at(step)

    @property
    def step(self) -> int:
        """Global steps consumed so far (what ``state()`` records)."""
        return self._parts.stream.step

    @property
    def prefetch_depth(self) -> int:
        """Steps read ahead now, ``prefetch`` or where ``"auto"`` settled (0 at first)."""
        return self._parts.stream.depth

    @property
    def prefetch_peak_bytes(self) -> int:
        """The most bytes of steps read ahead and not yet handed out, since the last
        iteration started (within ``prefetch_bytes`` plus one step)."""
        return self._parts.stream.peak_bytes

    def ids(self, step: int) -> np.ndarray:
        """The example ids of global step ``step`` (``-1`` marks padding)."""
        return self._parts.schedule.ids(step).copy()

    @property
    def skipped(self) -> list[Skipped]:
        """The examples this process skipped (``on_error="skip"``) in the steps handed
        out since the loader was built, restored or reset: ``(step, example, error)``."""
        return list(self._parts.stream.skips.entries)

    @property
    def filtered(self) -> int:
        """Examples the record transform dropped (returned ``None`` for) in the steps
        handed out since the loader was built: rows masked, not errors."""
        return int(self._parts.stream.counts()["filtered"])

    def stats(self, reset: bool = False) -> dict[str, Any]:
        """What this process's loader did, stage by stage, as a JSON-able dict.

        It covers the time since the loader was built, or since the last call with
        ``reset=True`` (which starts a new window after reporting this one):

        - ``seconds``, ``steps`` (handed out), ``records_per_s`` (their records a second,
          this process's);
        - ``source``: ``reads`` (calls), ``records``, ``bytes``, ``seconds`` (summed over
          the threads reading), ``skipped``, and ``url``: this process's ``requests``
          behind URLs (``retries`` among them), ``hedges`` and ``hedges_won``
          (duplicates sent for slow reads, and answered first), ``bytes`` fetched,
          ``cache_hits`` (reads served by a local copy) and ``cache_downloads`` -- every
          source's in the process;
        - ``record_transform`` (``None`` without one): ``records``, ``seconds`` (summed over
          the workers; with Ray, their reads of the source too, as the workers read it
          themselves), ``skipped``, ``filtered`` (examples it dropped by returning
          ``None``), ``workers``, ``worker_type``, ``lent`` (steps whose
          rows are out now in memory lent to arrays, the workers' slots or reused host
          buffers: a level, not a count);
        - ``transform`` (``None`` without one): ``calls``, ``seconds``;
        - ``place``: ``steps``, ``seconds`` putting rows on the devices;
        - ``consumer``: ``steps``, ``records`` (this process's, padding aside),
          ``wait_seconds`` (``next()`` waiting for rows: for the
          read-ahead's, ``wait_read_ahead_seconds``, and for the record workers',
          ``wait_workers_seconds``), ``next_seconds`` (all of ``next()``), and
          ``read_ahead``: its ``depth`` and reader ``threads`` now, ``moves`` (with
          ``prefetch="auto"``, its depth's last moves: ``step``, ``was``, ``depth``,
          ``why``, and for a trial judged, the rates and waits before and after and the
          noise margin), ``ready_share`` (asks that found the step ready),
          ``steps_ready`` and ``fill`` (steps ready at an ask, and that over the depth,
          on average), ``peak_bytes``;
        - ``counter_updates``: adds to these counters (each costs under 1 us).

        ``meshfeed.inspect.plot_pipeline(stats, path)`` draws where a step's time goes.
        """
        return self._parts.stats.report(reset)


def assemble(source: Source, fields: Mapping[str, FieldSpec], options: LoaderOptions) -> Assembly:
    """The parts of a loader over ``source`` with ``options`` (already checked)."""
    sharding = options.sharding
    reshard = options.strategy == "reshard"
    schedule, end = _schedule(source, options)
    plans: dict[int, Plan] = {}
    lanes: dict[int, Lane] = {}
    builder = None
    for b in options.batch_sizes.distinct:
        plans[b] = make_plan(_plan_fields(sharding, fields), b, requested=options.strategy)
        # One strategy for every size: the first size's (what "auto" picks rarely
        # depends on the size, and a run that switched strategies would be hard to read).
        builder = builder or BUILDERS[plans[b].strategy]  # type: ignore[index]
        loads = load_shardings(sharding, b) if reshard else sharding
        target = FieldShardings(loads, b)
        cut = _cut(source, fields, options, target) if builder.cuts is not None else None
        at = builder.cuts(target, cut) if builder.cuts is not None and cut is not None else None
        lanes[b] = Lane(b, target, builder.reads(target), loads, cut, at)
    assert builder is not None
    place = builder.place

    def lane(step: int) -> Lane:
        return lanes[schedule.size(step)]

    rows = SourceRows(source, fields, schedule, skip=options.on_error == "skip")
    reader = make_reader(rows, options, lane, max_depth=MAX_DEPTH)

    def place_step(step: int, host: HostStep | PendingStep) -> tuple[GlobalBatch, HostStep]:
        began = time.perf_counter()
        done = reader.finish(host)  # waits for record workers' rows, if any
        collected = time.perf_counter()
        batch = place(done.rows, lane(step).target, lane(step).cut)
        placed = time.perf_counter()
        done.collect_seconds, done.place_seconds = collected - began, placed - collected
        return batch, done

    stream = Stream(
        reader.read,
        place_step,
        skips=SkipLog(options.max_skipped),
        end=end,
        prefetch=options.prefetch,
        prefetch_bytes=options.prefetch_bytes,
        check_every=options.check_every,
        step_bytes=_step_bytes(fields, options, lanes.values()),
        steps_ahead=reader.steps_ahead,
        place_threads=_place_threads(options, lanes.values()),
        starved=reader.records.starved if reader.records is not None else None,
        workers=reader.records is not None and options.num_workers > 0,
    )
    timeline = Timeline(options.batch_sizes, source, end)
    kind = options.worker_type
    kind = (kind if isinstance(kind, str) else "ray") if options.num_workers else "inline"
    workers = (options.num_workers, kind)
    stats = PipelineStats(
        reader,
        rows.tally,
        stream,
        workers,
        schedule if isinstance(schedule, BalancedSchedule) else None,
    )
    return Assembly(schedule, end, lanes, plans, reader, stream, timeline, stats)


def _cut(
    source: Source, fields: Mapping[str, FieldSpec], options: LoaderOptions, target: FieldShardings
) -> SequenceCut | None:
    """Where each device reads only its slice of each row: a source that reads part of a
    row, a sharding that splits its sequence fields' dimension 1, and no transform or
    record transform (those see whole records)."""
    if options.transform is not None or options.record_transform is not None:
        return None
    if not isinstance(source, PartialRows):
        return None
    return sequence_cut(target, fields, source.sequence_fields)


def _step_bytes(
    fields: Mapping[str, FieldSpec], options: LoaderOptions, lanes: Iterable[Lane]
) -> int | None:
    """The most host bytes a step of this process reads, when the source's fields say it
    before any read: none transformed, none ragged."""
    if options.transform is not None or options.record_transform is not None:
        return None
    if any(spec.ragged for spec in fields.values()):
        return None
    row = sum(int(np.prod(spec.shape)) * np.dtype(spec.dtype).itemsize for spec in fields.values())
    return max(sum(len(rows) for rows in lane.row_sets) for lane in lanes) * (row + 1)


def _place_threads(options: LoaderOptions, lanes: Iterable[Lane]) -> int:
    """``place_threads``, with ``"auto"`` resolved: none where every device this
    process places on is a CPU (rows reach XLA:CPU without a copy), else a few."""
    if options.place_threads != "auto":
        return int(options.place_threads)
    devices = {d for lane in lanes for d in lane.target.devices}
    return 0 if all(d.platform == "cpu" for d in devices) else AUTO_PLACE_THREADS


def _schedule(source: Source, options: LoaderOptions) -> tuple[Schedule | RampSchedule, int | None]:
    """The schedule of ``source``'s examples under ``options``, and the step after the
    run's last."""
    n = len(source)
    epochs = options.num_epochs
    shuffle = options.shuffle
    seed = options.seed
    block = options.shuffle_block
    window = options.window
    rows = step_rows(source, options)
    if rows is not None:  # a balanced source: its steps, dealt to the devices by cost
        assert isinstance(source, BalancedSteps)
        sharding = options.sharding
        first = sharding if isinstance(sharding, NamedSharding) else next(iter(sharding.values()))
        balanced = BalancedSchedule(
            n,
            rows,
            shuffle=shuffle,
            seed=seed,
            costs=source.row_costs,
            devices=num_batch_shards(first),
        )
        return balanced, None if epochs is None else epochs * balanced.steps_per_epoch
    if not options.ramp:
        b = options.batch_sizes.size(0)
        fixed = Schedule(
            n,
            b,
            shuffle=shuffle,
            seed=seed,
            last_batch=options.last_batch,
            block=block,
            window=window,
        )
        return fixed, None if epochs is None else epochs * fixed.steps_per_epoch
    total = None if epochs is None else epochs * n
    ramp = RampSchedule(
        n,
        options.batch_sizes,
        shuffle=shuffle,
        seed=seed,
        total=total,
        block=block,
        window=window,
    )
    if total is None:
        return ramp, None
    return ramp, options.batch_sizes.steps_in(total, partial=options.last_batch == "pad")


def _plan_fields(sharding: ShardingArg, fields: Mapping[str, FieldSpec]) -> dict[str, Field]:
    """The source's fixed-shape fields with their shardings, for the planner."""
    out = {}
    for name, spec in fields.items():
        s = sharding if not isinstance(sharding, Mapping) else sharding.get(name)
        if s is not None and not spec.ragged:  # a ragged field's size is not known ahead
            out[name] = (fit_to_rank(s, 1 + len(spec.shape)), spec.shape, spec.dtype)
    if not out:  # a transform renames every field: plan the rows alone
        s = sharding if not isinstance(sharding, Mapping) else next(iter(sharding.values()))
        out["rows"] = (fit_to_rank(s, 1), (), np.dtype(np.uint8))
    return out
