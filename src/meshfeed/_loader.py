"""The Loader: a source, a schedule, a strategy, and a position in the stream.

``Loader`` yields one dict of global ``jax.Array`` per step, laid out by the requested
sharding. It is a façade over the pieces that do the work, in the order a batch meets
them: ``LoaderOptions`` checks the arguments, the ``Schedule`` gives each step's example
ids, the ``StepReader`` reads and transforms this process's rows of them (on a
background thread, ``Prefetcher``), and the strategy's ``Builder`` places them on the
devices. Its whole state is the number of steps consumed plus a fingerprint of what the
schedule depends on (``LoaderState``); since every process derives the schedule on its
own, that state restores exactly under any number of processes or devices.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import numpy as np

from meshfeed._env import require_initialized
from meshfeed._options import (
    PREFETCH_BYTES,
    LoaderOptions,
    Option,
    Prefetch,
    Transform,
    check_source,
    check_source_kind,
)
from meshfeed._pipeline import Inline, Prefetcher
from meshfeed._plan import Fetches, Field, Plan, Strategy, make_plan
from meshfeed._reader import SourceRows, make_reader
from meshfeed._record_rows import RecordFn
from meshfeed._records import WorkerType
from meshfeed._replicas import check_replicas
from meshfeed._schedule import LastBatch, Schedule
from meshfeed._shardings import FieldShardings, ShardingArg, fit_to_rank, load_shardings
from meshfeed._sources import FieldSpec, Source
from meshfeed._state import LoaderState, fingerprint
from meshfeed._strategies import BUILDERS
from meshfeed._watch import doing


class Loader:
    """Global sharded batches from a source, on one process or many.

    Args:
      source: a ``meshfeed.Source`` (``len``, ``source[ids]``, ``fields``).
      global_batch_size: rows of one step over all processes.
      sharding: a ``NamedSharding`` for every field, or a mapping field -> sharding.
        The batch dimension is the first; it must split evenly over its mesh axes.
      strategy: ``"per_process"`` (default), ``"global"``, ``"per_device"``,
        ``"reshard"`` or ``"auto"`` (README's strategy table). With ``"reshard"``
        batches arrive in ``loader.load_sharding``; move them with
        ``meshfeed.reshard(batch, loader.sharding)``, inside or outside ``jax.jit``.
      shuffle: a keyed random order per epoch; else ``0 .. N-1``.
      shuffle_block: shuffle blocks of this many consecutive examples instead of single
        examples, for data behind a URL: each step then reads a few contiguous runs
        (rows of one block sit together in a file) instead of one request per row. The
        blocks are permuted and each window of ``shuffle_window`` blocks is visited
        round-robin, one row of each in turn (README, "Data in object storage").
      shuffle_window: blocks visited together with ``shuffle_block`` (default 16): more
        mixes more, and each step reads about that many runs.
      seed: the key of that order.
      num_epochs: passes over the source; ``None`` for endless.
      last_batch: ``"drop"`` skips each epoch's final partial batch; ``"pad"`` fills it
        with zero rows and adds a boolean ``mask`` field (True for real rows).
      transform: a row-wise, vectorised function on the numpy dict of the rows a
        process loads, applied before they go to devices. It must keep the row count.
      prefetch: steps read ahead (source, record transforms, ``transform``) on
        background threads, several at once. ``"auto"`` (default) starts at 2 and
        deepens while the loop waits on a slow source or busy workers
        (``loader.prefetch_depth`` says where it settled); an int fixes it; 0 reads each
        step on demand. ``state()`` counts only the batches handed out.
      prefetch_bytes: the most bytes of batches read ahead (default 256 MiB).
      check_every: run ``meshfeed.check_replicas`` on every N-th batch (a collective that
        compares replicas across processes; raises ``ValueError`` if they differ).
      record_transform: ``fn(record, rng) -> record`` run on every example a process
        loads (decode, augment), before ``transform``; ``record`` maps field -> that
        example's value, ``rng`` a generator seeded from ``(seed, epoch, example_id)``.
        Every output record must have the same fields, shapes and dtypes.
      num_workers: workers for ``record_transform`` (0: in the loading thread). The
        output does not depend on it, nor on ``worker_type``.
      worker_type: ``"processes"`` (default): ``fn`` is sent to worker processes by
        value (cloudpickle), so it may come from a script, a notebook or a closure;
        ``"threads"``: a thread pool in this process, for decoders that release the GIL.

    Every argument is a read-only attribute afterwards (``loader.seed``, ...).

    Example:
      >>> loader = meshfeed.Loader(src, global_batch_size=256,  # doctest: +SKIP
      ...                          sharding=meshfeed.batch_sharding(mesh))
    """

    global_batch_size: Option[int] = Option()
    sharding: Option[ShardingArg] = Option()
    shuffle: Option[bool] = Option()
    shuffle_block: Option[int | None] = Option()
    shuffle_window: Option[int | None] = Option()
    seed: Option[int] = Option()
    num_epochs: Option[int | None] = Option()
    last_batch: Option[LastBatch] = Option()
    transform: Option[Transform | None] = Option()
    prefetch: Option[Prefetch] = Option()
    prefetch_bytes: Option[int] = Option()
    check_every: Option[int | None] = Option()
    record_transform: Option[RecordFn | None] = Option()
    num_workers: Option[int] = Option()
    worker_type: Option[WorkerType] = Option()

    def __init__(
        self,
        source: Source,
        *,
        global_batch_size: int,
        sharding: ShardingArg,
        strategy: Strategy = "per_process",
        shuffle: bool = True,
        shuffle_block: int | None = None,
        shuffle_window: int | None = None,
        seed: int = 0,
        num_epochs: int | None = 1,
        last_batch: LastBatch = "drop",
        transform: Transform | None = None,
        prefetch: Prefetch = "auto",
        prefetch_bytes: int = PREFETCH_BYTES,
        check_every: int | None = None,
        record_transform: RecordFn | None = None,
        num_workers: int = 0,
        worker_type: WorkerType = "processes",
    ) -> None:
        check_source_kind(source)
        options = LoaderOptions(
            global_batch_size=global_batch_size, sharding=sharding, strategy=strategy,
            shuffle=shuffle, shuffle_block=shuffle_block, shuffle_window=shuffle_window,
            seed=seed, num_epochs=num_epochs, last_batch=last_batch,
            transform=transform, prefetch=prefetch, prefetch_bytes=prefetch_bytes,
            check_every=check_every, record_transform=record_transform,
            num_workers=num_workers, worker_type=worker_type,
        )  # fmt: skip
        require_initialized()
        fields = check_source(source, options)
        b = global_batch_size
        self._source, self._options, self._fields = source, options, fields
        self._schedule = Schedule(
            len(source),
            b,
            shuffle=options.shuffle,
            seed=seed,
            last_batch=last_batch,
            block=shuffle_block,
            window=options.window,
        )
        self._end = None if num_epochs is None else num_epochs * self._schedule.steps_per_epoch
        self._load_sharding = load_shardings(sharding, b) if strategy == "reshard" else sharding
        self._plan = make_plan(_plan_fields(sharding, fields), b, requested=strategy)
        self._builder = BUILDERS[self._plan.strategy]  # type: ignore[index]
        self._target = FieldShardings(self._load_sharding, b)
        rows = SourceRows(source, fields, self._schedule)
        self._row_sets = self._builder.reads(self._target)
        self._reader = make_reader(rows, options, self._row_sets, self._target)
        self._step = 0
        self._ahead: Inline | Prefetcher | None = None

    @property
    def options(self) -> LoaderOptions:
        """Everything passed to ``Loader(...)`` but the source, as validated."""
        return self._options

    @property
    def source(self) -> Source:
        return self._source

    @property
    def strategy(self) -> str:
        """The strategy in use: the one requested, or what ``"auto"`` picked."""
        return self._plan.strategy

    @property
    def plan(self) -> Plan:
        """What each strategy costs here, and why this one (``meshfeed.show_plan``);
        for a source behind a URL, also the requests and bytes a step fetches here."""
        if self._plan.fetches is None and getattr(self._source, "remote", False):
            self._plan = dataclasses.replace(self._plan, fetches=self._sample_fetches())
        return self._plan

    def _sample_fetches(self, steps: int = 8) -> Fetches:
        fetches = self._source.fetches  # type: ignore[attr-defined]
        end = self._step + steps if self._end is None else min(self._end, self._step + steps)
        per_step = []
        for step in range(self._step, end):
            ids = np.concatenate([self._schedule.ids(step)[rows] for rows in self._row_sets])
            per_step.append(fetches(ids[ids >= 0]))
        return Fetches.sample(self._source.name, per_step)  # type: ignore[attr-defined]

    @property
    def load_sharding(self) -> ShardingArg:
        """Where batches arrive: ``sharding``, or the layout ``"reshard"`` loads in."""
        return self._load_sharding

    @property
    def steps_per_epoch(self) -> int:
        return self._schedule.steps_per_epoch

    @property
    def step(self) -> int:
        """Global steps consumed so far (what ``state()`` records)."""
        return self._step

    def __len__(self) -> int:
        if self._end is None:
            raise TypeError("the loader is endless (num_epochs=None) and has no len().")
        return self._end

    def __iter__(self) -> Iterator[dict[str, jax.Array]]:
        """Yields batches from the current step to the end of the run.

        The loader holds the position: a loop that stops early, then a new loop,
        continues where the first left off; ``reset()`` starts over.
        """
        ahead: Inline | Prefetcher | None = None
        try:
            while self._end is None or self._step < self._end:
                if ahead is None or ahead.next_step != self._step:  # or restore()/reset()
                    if ahead is not None:
                        ahead.close()
                    ahead = self._read_ahead()
                doing(f"loading step {self._step}")
                step, host = next(ahead)
                batch = self._builder.place(host, self._target)
                # In the consuming thread, in step order: a collective must run in the
                # same order on every process.
                if self.check_every and step % self.check_every == 0:
                    check_replicas(batch)
                self._step = step + 1
                doing(f"running step {step} (its batch loaded)")
                yield batch
        finally:
            if ahead is not None:
                ahead.close()

    def _read_ahead(self) -> Inline | Prefetcher:
        if self.prefetch == 0:
            self._ahead = Inline(self._reader.read, start=self._step)
        else:
            self._ahead = Prefetcher(
                self._reader.read,
                start=self._step,
                end=self._end,
                depth=None if self.prefetch == "auto" else self.prefetch,
                budget_bytes=self.prefetch_bytes,
            )
        return self._ahead

    @property
    def prefetch_depth(self) -> int:
        """Steps read ahead now: ``prefetch``, or what ``"auto"`` has adapted to (0
        before iterating)."""
        return 0 if self._ahead is None else self._ahead.depth

    @property
    def prefetch_peak_bytes(self) -> int:
        """The most bytes of steps read ahead and not yet handed out, since the last
        iteration started (within ``prefetch_bytes`` plus one step)."""
        return 0 if self._ahead is None else self._ahead.peak_bytes

    def batch(self, step: int) -> dict[str, jax.Array]:
        """The global batch of ``step``, without moving the loader's position."""
        return self._builder.place(self._reader.read(step), self._target)

    def ids(self, step: int) -> np.ndarray:
        """The example ids of global step ``step`` (``-1`` marks padding)."""
        return self._schedule.ids(step).copy()

    def reset(self) -> None:
        """Goes back to step 0."""
        self._step = 0

    def close(self) -> None:
        """Stops ``record_transform`` workers and frees their shared memory."""
        self._reader.close()

    def state(self) -> dict[str, Any]:
        """A small JSON-serialisable dict: steps consumed and what the schedule depends on."""
        return LoaderState.now(self._step, self._fingerprint()).to_json()

    def restore(self, state: Mapping[str, Any] | str | bytes) -> None:
        """Continues the stream exactly where ``state`` was taken.

        The state may come from a run with another number of processes or devices; it
        must come from the same source, seed, shuffle, batch size and last_batch.
        """
        restored = LoaderState.from_json(state)
        restored.check(self._fingerprint(), self._end)
        self._step = restored.step

    def _fingerprint(self) -> dict[str, Any]:
        return fingerprint(self._source, self._fields, self._options)

    def __repr__(self) -> str:
        steps = "endless" if self._end is None else f"{self._end} steps"
        return (
            f"Loader({self._source!r}, global_batch_size={self.global_batch_size}, "
            f"strategy={self.strategy!r}, {steps}, at step {self._step})"
        )


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
