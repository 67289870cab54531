"""The Loader: a source, a schedule, a strategy, and a position in the stream.

``Loader`` yields one dict of global ``jax.Array`` per step, laid out by the requested
sharding. It is a façade over the pieces that do the work: ``LoaderOptions`` checks
the arguments, ``assemble`` wires the parts (the ``Schedule`` gives each step's example
ids, the ``StepReader`` reads and transforms this process's rows of them, the strategy's
``Builder`` places them on the devices), and the ``Stream`` holds the position and
hands out batches read ahead on background threads. Its whole state is the number of
steps consumed plus a fingerprint of what the schedule depends on (``LoaderState``);
since every process derives the schedule on its own, that state restores exactly under
any number of processes or devices.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import jax

from meshfeed.cluster._initialize import ensure_watched
from meshfeed.core._stages import BatchSizeArg
from meshfeed.data._bad_records import OnError
from meshfeed.data._sources import Source
from meshfeed.feed._assembly import AssemblyViews, assemble
from meshfeed.feed._options import (
    PREFETCH_BYTES,
    LoaderOptions,
    OptionAttributes,
    PlaceThreads,
    Prefetch,
    Transform,
    bound,
    check_source,
    check_source_kind,
)
from meshfeed.feed._plan import Plan, Strategy
from meshfeed.feed._schedule import LastBatch
from meshfeed.feed._shardings import ShardingArg
from meshfeed.feed._skips import DEFAULT_MAX_SKIPPED
from meshfeed.feed._state import LoaderState, fingerprint
from meshfeed.workers._record_rows import RecordFn
from meshfeed.workers._records import WorkerType


class Loader(OptionAttributes, AssemblyViews):
    """Global sharded batches from a source, on one process or many.

    Args:
      source: a ``meshfeed.Source`` (``len``, ``source[ids]``, ``fields``). A mixture
        with stages is bound to this loader's steps, and read in order (``shuffle=False``).
      global_batch_size: rows of one step over all processes; or stages ``[(0, 32),
        (1000, 64)]``, a batch size that ramps (the schedules guide: epochs then count
        examples, a step may straddle two, and a train step compiles once per size).
      sharding: a ``NamedSharding`` for every field, or a mapping field -> sharding.
        The batch dimension is the first; it must split evenly over its mesh axes.
      strategy: ``"per_process"`` (default), ``"global"``, ``"per_device"``,
        ``"reshard"`` or ``"auto"`` (the strategies guide). With ``"reshard"``
        batches arrive in ``loader.load_sharding``; move them with
        ``meshfeed.reshard(batch, loader.sharding)``, inside or outside ``jax.jit``.
      shuffle: a keyed random order per epoch; else ``0 .. N-1``.
      shuffle_block: shuffle blocks of this many consecutive examples, for data behind
        a URL: each step reads a few contiguous runs instead of one request per row
        (the object storage guide).
      shuffle_window: blocks visited together, round-robin, with ``shuffle_block``
        (default 16): more mixes more, and each step reads about that many runs.
      seed: the key of that order.
      num_epochs: passes over the source; ``None`` for endless.
      last_batch: ``"drop"`` skips each epoch's final partial batch; ``"pad"`` fills it
        with zero rows and adds a boolean ``mask`` field (True for real rows).
      transform: a row-wise, vectorised function on the numpy dict of the rows a
        process loads, applied before they go to devices. It must keep the row count.
      prefetch: steps read ahead (source, record transforms, ``transform``) on
        background threads, several at once. ``"auto"`` (default) reads the first
        steps together, starts at 2 (16 for a slow source) and moves by trials judged
        on the steps per second before and after: deeper while the loop waits on a
        slow source, shallower where depth does not pay, down to 0 (the loop reads
        each step itself, where a reader thread's hand-offs cost more than they hide:
        rows in memory, many small shards) while that runs faster
        (``loader.prefetch_depth`` says where it is, ``loader.stats()`` its moves and
        why); an int fixes it;
        0 reads each step on demand (record workers hold the steps read ahead).
        ``state()`` counts only the batches handed out.
      prefetch_bytes: the most bytes of batches read ahead (default 256 MiB).
      place_threads: threads that collect steps from the record workers and place them
        on the devices ahead of the loop, so the loop's thread only takes finished
        steps (host-to-device copies on a GPU scale with threads). ``"auto"``
        (default): none on CPU devices, where rows reach XLA without a copy, 4
        elsewhere; an int fixes it (0: on the loop's thread).
      check_every: run ``meshfeed.check_replicas`` on every N-th batch (a collective that
        compares replicas across processes; raises ``ValueError`` if they differ).
      record_transform: ``fn(record, rng) -> record`` run on every example a process
        loads (decode, augment), before ``transform``; ``record`` maps field -> that
        example's value, ``rng`` a generator seeded from ``(seed, epoch, example_id)``.
        Every output record must have the same fields, shapes and dtypes. Returning
        ``None`` drops the example: its row is zeros with ``mask`` False (with a record
        transform the batches carry the ``mask`` field), the schedule unchanged, not an
        error; ``loader.filtered`` and ``stats()`` count them.
      num_workers: workers for ``record_transform`` (0: in the loading thread). The
        output does not depend on it, nor on ``worker_type``.
      worker_type: ``"processes"`` (default): ``fn`` is sent to worker processes by
        value (cloudpickle), so it may come from a script, a notebook or a closure;
        ``"threads"``: a thread pool in this process, for decoders that release the GIL;
        ``"ray"`` (or ``meshfeed.RayOptions(...)``, what each reserves): Ray actors on
        the cluster this process is connected to, or ``RAY_ADDRESS``'s, or a local one;
        they read the source themselves, and a chunk lost with one is computed again.
      on_error: what a bad record does -- a read of it that raises (anything but an
        ``OSError``, which is the storage's: an outage, a missing file) or a
        ``record_transform`` that raises on it. ``"raise"`` (default) ends the run;
        ``"skip"`` makes it a zero row with ``mask`` False (the field is added, as by
        ``last_batch="pad"``): every other row keeps its place, the batch its shape and
        the schedule its steps, whatever the workers or processes. ``loader.skipped``
        lists them; ``state()`` counts them.
      max_skipped: with ``"skip"``, the most examples this process may skip before the
        loader raises: a count (an int), or a fraction of the examples it read (a float;
        default 0.01, and never fewer than 100).

    Every argument is a read-only attribute afterwards (``loader.seed``, ...).

    Example:
      >>> loader = meshfeed.Loader(src, global_batch_size=256,  # doctest: +SKIP
      ...                          sharding=meshfeed.batch_sharding(mesh))
    """

    def __init__(
        self,
        source: Source,
        *,
        global_batch_size: BatchSizeArg,
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
        place_threads: PlaceThreads = "auto",
        check_every: int | None = None,
        record_transform: RecordFn | None = None,
        num_workers: int = 0,
        worker_type: WorkerType = "processes",
        on_error: OnError = "raise",
        max_skipped: int | float = DEFAULT_MAX_SKIPPED,
    ) -> None:
        check_source_kind(source)
        options = LoaderOptions(
            global_batch_size=global_batch_size, sharding=sharding, strategy=strategy,
            shuffle=shuffle, shuffle_block=shuffle_block, shuffle_window=shuffle_window,
            seed=seed, num_epochs=num_epochs, last_batch=last_batch,
            transform=transform, prefetch=prefetch, prefetch_bytes=prefetch_bytes,
            place_threads=place_threads, check_every=check_every, record_transform=record_transform,
            num_workers=num_workers, worker_type=worker_type, on_error=on_error,
            max_skipped=max_skipped,
        )  # fmt: skip
        ensure_watched()  # connected if started as several; watched (if several)
        self._source = source = bound(source, options)  # a mixture by stage counts our steps
        self._options = options
        self._fields = check_source(source, options)
        self._parts = assemble(source, self._fields, options)

    @property
    def options(self) -> LoaderOptions:
        """Everything passed to ``Loader(...)`` but the source, as validated."""
        return self._options

    @property
    def source(self) -> Source:
        """The source the loader reads."""
        return self._source

    @property
    def strategy(self) -> str:
        """The strategy in use, the one requested or what ``"auto"`` picked."""
        return self._parts.plans[self.batch_size(0)].strategy

    @property
    def plan(self) -> Plan:
        """What each strategy costs at the current step's batch size, and why this one
        (``meshfeed.show_plan``); for a source behind a URL, also the requests and bytes
        a step fetches here; with stages, the spans of steps ahead and what holds in each."""
        return self._parts.plan_at(self.step, self._source)

    @property
    def load_sharding(self) -> ShardingArg:
        """Where batches arrive, ``sharding`` or the layout ``"reshard"`` loads in."""
        return self._parts.lane(self.step).load_sharding

    def __len__(self) -> int:
        """Steps in the whole run (``num_epochs`` epochs); an endless loader has none."""
        if self._parts.end is None:
            raise TypeError("the loader is endless (num_epochs=None) and has no len().")
        return self._parts.end

    def __iter__(self) -> Iterator[dict[str, jax.Array]]:
        """Yields batches from the current step to the end of the run.

        The loader holds the position: a loop that stops early, then a new loop,
        continues where the first left off; ``reset()`` starts over.
        """
        return iter(self._parts.stream)

    def batch(self, step: int) -> dict[str, jax.Array]:
        """The global batch of ``step``, without moving the loader's position."""
        return self._parts.stream.batch(step)

    def reset(self) -> None:
        """Goes back to step 0."""
        self._parts.stream.step = 0
        self._parts.stream.skips.restart(0)

    def close(self) -> None:
        """Stops ``record_transform`` workers and frees their shared memory."""
        self._parts.reader.close()

    def state(self) -> dict[str, Any]:
        """A small JSON-serialisable dict: steps consumed and what the schedule depends on."""
        skipped = self._parts.stream.skips.count
        return LoaderState.now(self.step, self._fingerprint(), skipped).to_json()

    def restore(self, state: Mapping[str, Any] | str | bytes) -> None:
        """Continues the stream exactly where ``state`` was taken.

        The state may come from a run with another number of processes or devices; it
        must come from the same source, seed, shuffle, batch size and last_batch. A
        schedule (a batch size or mixture weights by stage) may differ after the
        state's step -- stages appended or changed there -- but not before it.
        """
        restored = LoaderState.from_json(state)
        restored.check(self._fingerprint(), self._parts.end, self._options.batch_sizes.position)
        self._parts.stream.step = restored.step
        self._parts.stream.skips.restart(restored.skipped)

    def _fingerprint(self) -> dict[str, Any]:
        return fingerprint(self._source, self._fields, self._options)

    def __repr__(self) -> str:
        steps = "endless" if self._parts.end is None else f"{self._parts.end} steps"
        return (
            f"Loader({self._source!r}, global_batch_size={self.global_batch_size!r}, "
            f"strategy={self.strategy!r}, {steps}, at step {self.step})"
        )
