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

import dataclasses
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import jax

from meshfeed.cluster._initialize import ensure_watched
from meshfeed.core._stages import BatchSizeArg
from meshfeed.data._bad_records import OnError
from meshfeed.data._sources import Source
from meshfeed.feed._assembly import AssemblyViews, assemble
from meshfeed.feed._option import add_attributes, args_section, groups_line
from meshfeed.feed._options import (
    GROUPS,
    PREFETCH_BYTES,
    SOURCE_DOC,
    LoaderOptions,
    PlaceThreads,
    Prefetch,
    Transform,
)
from meshfeed.feed._plan import Plan, Strategy
from meshfeed.feed._schedule import LastBatch
from meshfeed.feed._shardings import ShardingArg
from meshfeed.feed._skips import DEFAULT_MAX_SKIPPED
from meshfeed.feed._source_check import bound, check_source, check_source_kind
from meshfeed.feed._state import LoaderState, continued_sizes, fingerprint
from meshfeed.workers._record_rows import RecordFn
from meshfeed.workers._records import WorkerType


class Loader(AssemblyViews):
    """Global sharded batches from a source, on one process or many.

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
        record_transform: RecordFn | None = None,
        num_workers: int = 0,
        worker_type: WorkerType = "processes",
        prefetch: Prefetch = "auto",
        prefetch_bytes: int = PREFETCH_BYTES,
        place_threads: PlaceThreads = "auto",
        on_error: OnError = "raise",
        max_skipped: int | float = DEFAULT_MAX_SKIPPED,
        check_every: int | None = None,
    ) -> None:
        # The keywords are LoaderOptions' fields, in their order (a test holds them).
        given = {k: v for k, v in locals().items() if k not in ("self", "source")}
        check_source_kind(source)
        options = LoaderOptions(**given)
        ensure_watched()  # connected if started as several; watched (if several)
        self._given = source
        self._build(options)

    def _build(self, options: LoaderOptions) -> None:
        self._source = source = bound(self._given, options)  # a mixture by stage counts our steps
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
        """Steps in one pass (``num_epochs`` epochs); an endless loader has none."""
        if self._parts.pass_steps is None:
            raise TypeError("the loader is endless (num_epochs=None) and has no len().")
        return self._parts.pass_steps

    def __iter__(self) -> Iterator[dict[str, jax.Array]]:
        """Yields batches from the current step to the end of the pass.

        The loader holds the position: a loop that stops early, then a new loop,
        continues where the first left off; ``reset()`` starts over. A loop begun where
        a pass ended runs the next ``num_epochs`` epochs, each in its own order, so the
        epoch loop of PyTorch, tf.data and Keras reads every epoch::

            for epoch in range(3):
                for batch in loader:  # num_epochs=1 (the default): one epoch each
                    ...

        Raises:
          RuntimeError: the loader is closed; or its pass ended under a batch size that
            ramps, whose epochs do not line up with steps (pass more ``num_epochs``).
        """
        return self._parts.loop()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def batch(self, step: int) -> dict[str, jax.Array]:
        """The global batch of ``step``, without moving the loader's position."""
        return self._parts.stream.batch(step)

    def reset(self) -> None:
        """Goes back to step 0."""
        self._parts.run_to(self._parts.pass_steps)
        self._parts.stream.step = 0
        self._parts.stream.skips.restart(0)

    def close(self) -> None:
        """Stops the read-ahead's threads (also of loops not run to their end) and the
        ``record_transform`` workers, and frees their shared memory. ``with
        meshfeed.Loader(...) as loader:`` closes it at the end of the block."""
        self._parts.stream.close()
        self._parts.reader.close()

    def state(self) -> dict[str, Any]:
        """A small JSON-serialisable dict: steps consumed and what the schedule depends on."""
        skipped = self._parts.stream.skips.count
        return LoaderState.now(self.step, self._fingerprint(), skipped).to_json()

    def restore(self, state: Mapping[str, Any] | str | bytes) -> None:
        """Continues the stream exactly where ``state`` was taken.

        The state may come from a run with another number of processes or devices; it
        must come from the same source, seed, shuffle and last_batch. A loader given one
        ``global_batch_size`` continues a state taken under another (or under a schedule):
        the state's sizes hold for the steps it took and this loader's from there on, as
        a stage appended at the restored step, so the epoch still reads every example
        once, from the example the state had reached; ``global_batch_size`` then shows
        that schedule, and the steps of a pass change with it. A schedule given here (a
        batch size or mixture weights by stage) may differ after the state's step --
        stages appended or changed there -- but not before it.
        """
        restored = LoaderState.from_json(state)
        sizes = self._options.global_batch_size
        continued = continued_sizes(restored, sizes) if isinstance(sizes, int) else None
        if continued is not None and continued != sizes:
            self.close()  # its read-ahead and workers serve the old batch size
            self._build(dataclasses.replace(self._options, global_batch_size=continued))
        end = self._parts.pass_end(restored.step)
        restored.check(self._fingerprint(), end, self._options.batch_sizes.position)
        self._parts.run_to(end)
        self._parts.stream.step = restored.step
        self._parts.stream.skips.restart(restored.skipped)

    def _fingerprint(self) -> dict[str, Any]:
        return fingerprint(self._source, self._fields, self._options)

    def __repr__(self) -> str:
        size = self._parts.pass_steps
        steps = "endless" if size is None else f"{size} steps a pass"
        return (
            f"Loader({self._source!r}, global_batch_size={self.global_batch_size!r}, "
            f"strategy={self.strategy!r}, {steps}, at step {self.step})"
        )

    if TYPE_CHECKING:  # the options' attributes, added below from LoaderOptions' fields

        def __getattr__(self, name: str) -> Any: ...


add_attributes(Loader, LoaderOptions)
Loader.__doc__ = (Loader.__doc__ or "").replace(
    "\n    Every argument",
    "\n"
    + groups_line(GROUPS)
    + "\n"
    + args_section(LoaderOptions, {"source": SOURCE_DOC})
    + "\n    Every argument",
    1,
)
