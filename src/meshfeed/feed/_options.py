"""A loader's options, each defined once, checked once, before anything starts.

``LoaderOptions`` is a frozen dataclass that checks itself on construction (grain's
option bundles are the model), made of one dataclass per group of options: the layout,
the order, the work on the host, the read-ahead, the faults. Each option is one field
made by ``option(...)``: its name, type and default, its text (``Loader``'s Args are made
of them) and its own check, with the error that names it and the fix. Options that only
make sense together are then checked by their group (``check_together``): a shuffle
block and its window, a record function and its workers, a skip budget and
``on_error``. ``Loader`` keeps the flat keywords users know from the
PyTorch DataLoader, in the order of the groups, and reads each option back as a
read-only attribute (``add_attributes``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from meshfeed.cluster._ray_connect import RayOptions
from meshfeed.core._stages import BatchSizeArg, BatchSizes
from meshfeed.data._bad_records import ON_ERROR, OnError
from meshfeed.feed._option import check_each, count, function, is_count, known, option
from meshfeed.feed._plan import STRATEGIES, Strategy
from meshfeed.feed._schedule import LAST_BATCH, LastBatch
from meshfeed.feed._shardings import ShardingArg
from meshfeed.feed._skips import DEFAULT_MAX_SKIPPED
from meshfeed.workers._processes import send_by_value
from meshfeed.workers._record_rows import RecordFn
from meshfeed.workers._records import WORKER_TYPES, WorkerType

Transform = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
"""A vectorised function on the numpy rows a process loads for a step: fields in,
fields out, the same row count."""
Prefetch = int | Literal["auto"]
"""Steps the loader reads ahead: a number (0: on demand), or ``"auto"`` to adapt."""
PlaceThreads = int | Literal["auto"]
"""Threads that place steps on the devices off the loop's thread: a number (0: on the
loop's thread), or ``"auto"``: none on CPU devices, ``AUTO_PLACE_THREADS`` elsewhere."""
AUTO_PLACE_THREADS = 4  # device_put of numpy batches scaled to ~4 threads on an H200 host
PREFETCH_BYTES = 256 << 20
SHUFFLE_WINDOW = 16  # blocks mixed together by default with shuffle_block
SOURCE_DOC = (
    "a ``meshfeed.Source`` (``len``, ``source[ids]``, ``fields``). A mixture with "
    "stages is bound to this loader's steps, and read in order (``shuffle=False``)."
)
"""The text of ``Loader``'s one positional argument, which is not an option."""


def _batch_size(name: str, b: Any) -> None:
    if isinstance(b, bool) or not isinstance(b, int | list | tuple):
        raise TypeError(
            f"{name}={b!r} must be an int, or a list of (start_step, size) stages, e.g. "
            "[(0, 32), (1000, 64)]."
        )
    if isinstance(b, int) and b < 1:
        raise ValueError(f"{name}={b} must be >= 1.")


def _sharding_kind(name: str, sharding: Any) -> None:
    if isinstance(sharding, Mapping):
        if not sharding:
            raise ValueError(f"{name} is an empty mapping; name a sharding for every field.")
    elif isinstance(sharding, PartitionSpec):
        raise TypeError(
            f"{name} is a PartitionSpec {sharding}, which names no mesh; pass "
            f"NamedSharding(mesh, {sharding}) or meshfeed.batch_sharding(mesh)."
        )
    elif not isinstance(sharding, NamedSharding):
        raise TypeError(
            f"{name} is a {type(sharding).__name__}; pass a jax.sharding.NamedSharding "
            "(e.g. meshfeed.batch_sharding(mesh)) or a mapping field -> NamedSharding."
        )


def _worker_kind(name: str, kind: Any) -> None:
    if not isinstance(kind, RayOptions) and kind not in WORKER_TYPES:
        raise ValueError(
            f"{name}={kind!r} is unknown; pass 'processes', 'threads', 'ray' or "
            "meshfeed.types.RayOptions(...)."
        )


def _skip_budget(name: str, most: Any) -> None:
    if not ((isinstance(most, float) and 0 < most < 1) or (is_count(most) and most >= 0)):
        raise ValueError(
            f"{name}={most!r} must be a count (an int >= 0) or a fraction of the examples "
            "read (a float between 0 and 1, e.g. 0.01)."
        )


@dataclasses.dataclass(frozen=True)
class Layout:
    """What a step holds and where it goes."""

    global_batch_size: BatchSizeArg = option(
        check=_batch_size,
        doc=(
            "rows of one step over all processes; or stages ``[(0, 32), (1000, 64)]``, a batch "
            "size that ramps (the schedules guide: epochs then count examples, a step may "
            "straddle two, and a train step compiles once per size)."
        ),
    )
    sharding: ShardingArg = option(
        check=_sharding_kind,
        doc=(
            "a ``NamedSharding`` for every field, or a mapping field -> sharding. The batch "
            "dimension is the first; it must split evenly over its mesh axes."
        ),
    )
    strategy: Strategy = option(
        "per_process",
        check=known(STRATEGIES, f"one of {list(STRATEGIES)}"),
        doc=(
            '``"per_process"`` (default), ``"global"``, ``"per_device"``, ``"reshard"`` or '
            '``"auto"`` (the strategies guide). With ``"reshard"`` batches arrive in '
            "``loader.load_sharding``; move them with ``meshfeed.reshard(batch, "
            "loader.sharding)``, inside or outside ``jax.jit``."
        ),
    )

    def check_together(self) -> None:
        """Nothing: each of these is checked alone."""


@dataclasses.dataclass(frozen=True)
class Order:
    """The order of the examples."""

    shuffle: bool = option(
        True,
        doc="a keyed random order per epoch; else ``0 .. N-1``.",
    )
    shuffle_block: int | None = option(
        None,
        check=count(
            1, "an int >= 1 (examples per block), or None to shuffle single examples", none=True
        ),
        doc=(
            "shuffle blocks of this many consecutive examples, for data behind a URL: each step "
            "reads a few contiguous runs instead of one request per row (the object storage "
            "guide)."
        ),
    )
    shuffle_window: int | None = option(
        None,
        check=count(1, "an int >= 1 (blocks mixed)", none=True),
        doc=(
            "blocks visited together, round-robin, with ``shuffle_block`` (default 16): more "
            "mixes more, and each step reads about that many runs."
        ),
    )
    seed: int = option(0, check=count(0, "an int >= 0"), doc="the key of that order.")
    num_epochs: int | None = option(
        1,
        check=count(1, "an int >= 1, or None for endless", none=True),
        doc="passes over the source; ``None`` for endless.",
    )
    last_batch: LastBatch = option(
        "drop",
        check=known(LAST_BATCH, "'drop' or 'pad'"),
        doc=(
            '``"drop"`` skips each epoch\'s final partial batch; ``"pad"`` fills it with zero '
            "rows and adds a boolean ``mask`` field (True for real rows)."
        ),
    )

    def check_together(self) -> None:
        block, window = self.shuffle_block, self.shuffle_window
        if block is None and window is not None:
            raise ValueError(
                f"shuffle_window={window} mixes blocks, but no shuffle_block was given; "
                "pass shuffle_block=k too."
            )
        if block is not None and not self.shuffle:
            raise ValueError(
                f"shuffle_block={block} orders blocks at random, but shuffle=False; pass "
                "shuffle=True, or drop shuffle_block."
            )


@dataclasses.dataclass(frozen=True)
class HostWork:
    """Work on a process's rows before they reach the devices."""

    transform: Transform | None = option(
        None,
        check=function("a function of a dict of arrays"),
        doc=(
            "a row-wise, vectorised function on the numpy dict of the rows a process loads, "
            "applied before they go to devices. It must keep the row count."
        ),
    )
    record_transform: RecordFn | None = option(
        None,
        check=function("a function fn(record, rng) -> record"),
        doc=(
            "``fn(record, rng) -> record`` run on every example a process loads (decode, "
            "augment), before ``transform``; ``record`` maps field -> that example's value, "
            "``rng`` a generator seeded from ``(seed, epoch, example_id)``. Every output record "
            "must have the same fields, shapes and dtypes. Returning ``None`` drops the "
            "example: its row is zeros with ``mask`` False (with a record transform the batches "
            "carry the ``mask`` field), the schedule unchanged, not an error; "
            "``loader.filtered`` and ``stats()`` count them."
        ),
    )
    num_workers: int = option(
        0,
        check=count(0, "an int >= 0"),
        doc=(
            "workers for ``record_transform`` (0: in the loading thread). The output does not "
            "depend on it, nor on ``worker_type``."
        ),
    )
    worker_type: WorkerType = option(
        "processes",
        check=_worker_kind,
        doc=(
            '``"processes"`` (default): ``fn`` is sent to worker processes by value '
            "(cloudpickle), so it may come from a script, a notebook or a closure; "
            '``"threads"``: a thread pool in this process, for decoders that release the GIL; '
            '``"ray"`` (or ``meshfeed.types.RayOptions(...)``, what each reserves): Ray actors '
            "on the cluster this process is connected to, or ``RAY_ADDRESS``'s, or a local one; "
            "they read the source themselves, and a chunk lost with one is computed again."
        ),
    )

    def check_together(self) -> None:
        fn, workers = self.record_transform, self.num_workers
        if workers and fn is None:
            raise ValueError(
                f"num_workers={workers} runs record_transform in worker processes, but no "
                "record_transform was given; pass one, or num_workers=0."
            )
        if workers and self.worker_type != "threads":
            try:
                send_by_value(fn)
            except Exception as error:
                raise TypeError(
                    f"record_transform cannot be sent to worker processes: {type(error).__name__}: "
                    f"{error}. Keep what it captures picklable (no locks, open files or "
                    "sockets), or pass worker_type='threads' or num_workers=0."
                ) from None


@dataclasses.dataclass(frozen=True)
class ReadAhead:
    """Reading ahead."""

    prefetch: Prefetch = option(
        "auto",
        check=count(
            0,
            "'auto' (read-ahead that adapts) or an int >= 0 (steps read ahead; 0 reads each "
            "batch on demand)",
            auto=True,
        ),
        doc=(
            "steps read ahead (source, record transforms, ``transform``) on background threads, "
            'several at once. ``"auto"`` (default) reads the first steps together, starts at 2 '
            "(16 for a slow source) and moves by trials judged on the steps per second before "
            "and after: deeper while the loop waits on a slow source, shallower where depth "
            "does not pay, down to 0 (the loop reads each step itself, where a reader thread's "
            "hand-offs cost more than they hide: rows in memory, many small shards) while that "
            "runs faster (``loader.prefetch_depth`` says where it is, ``loader.stats()`` its "
            "moves and why); an int fixes it; 0 reads each step on demand (record workers hold "
            "the steps read ahead). ``state()`` counts only the batches handed out."
        ),
    )
    prefetch_bytes: int = option(
        PREFETCH_BYTES,
        check=count(1, "an int >= 1 (the most bytes of batches read ahead)"),
        doc="the most bytes of batches read ahead (default 256 MiB).",
    )
    place_threads: PlaceThreads = option(
        "auto",
        check=count(
            0,
            f"'auto' (none on CPU devices, {AUTO_PLACE_THREADS} elsewhere) or an int >= 0 "
            "(threads that place steps on the devices; 0 places them on the loop's thread)",
            auto=True,
        ),
        doc=(
            "threads that collect steps from the record workers and place them on the devices "
            "ahead of the loop, so the loop's thread only takes finished steps (host-to-device "
            'copies on a GPU scale with threads). ``"auto"`` (default): none on CPU devices, '
            "where rows reach XLA without a copy, 4 elsewhere; an int fixes it (0: on the "
            "loop's thread)."
        ),
    )

    def check_together(self) -> None:
        """Nothing: each of these is checked alone."""


@dataclasses.dataclass(frozen=True)
class Faults:
    """Bad records and replicas that differ."""

    on_error: OnError = option(
        "raise",
        check=known(
            ON_ERROR,
            "'raise' (a bad record ends the run) or 'skip' (it becomes a masked row, within "
            "max_skipped)",
        ),
        doc=(
            "what a bad record does -- a read of it that raises (anything but an ``OSError``, "
            "which is the storage's: an outage, a missing file) or a ``record_transform`` that "
            'raises on it. ``"raise"`` (default) ends the run; ``"skip"`` makes it a zero row '
            'with ``mask`` False (the field is added, as by ``last_batch="pad"``): every other '
            "row keeps its place, the batch its shape and the schedule its steps, whatever the "
            "workers or processes. ``loader.skipped`` lists them; ``state()`` counts them."
        ),
    )
    max_skipped: int | float = option(
        DEFAULT_MAX_SKIPPED,
        check=_skip_budget,
        doc=(
            'with ``"skip"``, the most examples this process may skip before the loader raises: '
            "a count (an int), or a fraction of the examples it read (a float; default 0.01, "
            "and never fewer than 100)."
        ),
    )
    check_every: int | None = option(
        None,
        check=count(
            1, "an int >= 1 (steps between replica checks), or None for no checks", none=True
        ),
        doc=(
            "run ``meshfeed.inspect.check_replicas`` on every N-th batch (a collective that "
            "compares replicas across processes; raises ``ValueError`` if they differ)."
        ),
    )

    def check_together(self) -> None:
        if self.on_error == "raise" and self.max_skipped != DEFAULT_MAX_SKIPPED:
            raise ValueError(
                f"max_skipped={self.max_skipped!r} bounds the examples on_error='skip' skips, "
                "but on_error='raise'; pass on_error='skip' too, or drop max_skipped."
            )


@dataclasses.dataclass(frozen=True)
class LoaderOptions(Faults, ReadAhead, HostWork, Order, Layout):
    """What a ``Loader`` does with its source; see ``Loader`` for each argument. Its
    bases are the groups of options, in order; their fields are the options, in order."""

    batch_sizes: BatchSizes = dataclasses.field(init=False, repr=False, compare=False)
    """``global_batch_size`` as stages (one, for an int)."""

    def __post_init__(self) -> None:
        check_each(self)
        object.__setattr__(self, "batch_sizes", BatchSizes.parse(self.global_batch_size))
        object.__setattr__(self, "shuffle", bool(self.shuffle))
        for group in GROUPS:  # then the options that only make sense together
            group.check_together(self)

    @property
    def ramp(self) -> bool:
        """Whether ``global_batch_size`` is given by stages (epochs counted in examples)."""
        return not is_count(self.global_batch_size)

    @property
    def window(self) -> int:
        """Blocks mixed together with ``shuffle_block`` (``SHUFFLE_WINDOW`` by default)."""
        return SHUFFLE_WINDOW if self.shuffle_window is None else self.shuffle_window


GROUPS: tuple[type, ...] = tuple(reversed(LoaderOptions.__bases__))
"""The groups of options, in the order of their fields (``LoaderOptions``' bases, last first)."""
