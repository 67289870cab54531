"""A loader's options, checked once, before anything starts.

``LoaderOptions`` is a frozen dataclass that validates itself on construction (grain's
option bundles are the model): every argument of ``Loader(...)`` but the source, each
with the error that names it and the fix. ``check_source`` then checks the source
against them -- its kind, its length, and the shardings against its fields -- so a
``Loader`` either gets fully valid input or raises before any thread, worker process or
array exists. ``Option`` exposes one option as a read-only attribute of the loader: it
read each option once, so setting one afterwards would change nothing and raises.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Generic, Literal, TypeVar, cast, overload

import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from meshfeed.core._mesh import check_sharding
from meshfeed.core._stages import BatchSizeArg, BatchSizes
from meshfeed.data._bad_records import ON_ERROR, OnError
from meshfeed.data._sources import FieldSpec, Source
from meshfeed.feed._plan import STRATEGIES, Strategy
from meshfeed.feed._schedule import LAST_BATCH, MASK, LastBatch
from meshfeed.feed._shardings import ShardingArg
from meshfeed.feed._skips import DEFAULT_MAX_SKIPPED
from meshfeed.workers._processes import send_by_value
from meshfeed.workers._ray_connect import RayOptions
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
T = TypeVar("T")


def _count(value: object) -> bool:
    """An ``int`` proper (``bool`` is an int to Python, never a count here)."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class LoaderOptions:
    """What a ``Loader`` does with its source; see ``Loader`` for each argument."""

    global_batch_size: BatchSizeArg
    sharding: ShardingArg
    strategy: Strategy = "per_process"
    shuffle: bool = True
    shuffle_block: int | None = None
    shuffle_window: int | None = None
    seed: int = 0
    num_epochs: int | None = 1
    last_batch: LastBatch = "drop"
    transform: Transform | None = None
    prefetch: Prefetch = "auto"
    prefetch_bytes: int = PREFETCH_BYTES
    place_threads: PlaceThreads = "auto"
    check_every: int | None = None
    record_transform: RecordFn | None = None
    num_workers: int = 0
    worker_type: WorkerType = "processes"
    on_error: OnError = "raise"
    max_skipped: int | float = DEFAULT_MAX_SKIPPED
    batch_sizes: BatchSizes = dataclasses.field(init=False, repr=False, compare=False)
    """``global_batch_size`` as stages (one, for an int)."""

    def __post_init__(self) -> None:
        b = self.global_batch_size
        if isinstance(b, bool) or not isinstance(b, int | list | tuple):
            raise TypeError(
                f"global_batch_size={b!r} must be an int, or a list of (start_step, size) "
                "stages, e.g. [(0, 32), (1000, 64)]."
            )
        if isinstance(b, int) and b < 1:
            raise ValueError(f"global_batch_size={b} must be >= 1.")
        object.__setattr__(self, "batch_sizes", BatchSizes.parse(b))
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"strategy={self.strategy!r} is unknown; pass one of {list(STRATEGIES)}."
            )
        if self.last_batch not in LAST_BATCH:
            raise ValueError(f"last_batch={self.last_batch!r} is unknown; pass 'drop' or 'pad'.")
        if not _count(self.seed) or self.seed < 0:
            raise ValueError(f"seed={self.seed!r} must be an int >= 0.")
        epochs = self.num_epochs
        if epochs is not None and (not _count(epochs) or epochs < 1):
            raise ValueError(f"num_epochs={epochs!r} must be an int >= 1, or None for endless.")
        if self.transform is not None and not callable(self.transform):
            raise TypeError(f"transform={self.transform!r} must be a function of a dict of arrays.")
        if self.prefetch != "auto" and (not _count(self.prefetch) or self.prefetch < 0):  # type: ignore[operator]
            raise ValueError(
                f"prefetch={self.prefetch!r} must be 'auto' (read-ahead that adapts) or an "
                "int >= 0 (steps read ahead; 0 reads each batch on demand)."
            )
        if not _count(self.prefetch_bytes) or self.prefetch_bytes < 1:
            raise ValueError(
                f"prefetch_bytes={self.prefetch_bytes!r} must be an int >= 1 (the most bytes "
                "of batches read ahead)."
            )
        threads = self.place_threads
        if threads != "auto" and (not _count(threads) or threads < 0):  # type: ignore[operator]
            raise ValueError(
                f"place_threads={threads!r} must be 'auto' (none on CPU devices, "
                f"{AUTO_PLACE_THREADS} elsewhere) or an int >= 0 (threads that place steps on "
                "the devices; 0 places them on the loop's thread)."
            )
        self._check_records()
        self._check_errors()
        self._check_blocks()
        every = self.check_every
        if every is not None and (not _count(every) or every < 1):
            raise ValueError(
                f"check_every={every!r} must be an int >= 1 (steps between replica "
                "checks), or None for no checks."
            )
        _check_sharding_kind(self.sharding)
        object.__setattr__(self, "shuffle", bool(self.shuffle))

    def _check_blocks(self) -> None:
        block, window = self.shuffle_block, self.shuffle_window
        if block is not None and (not _count(block) or block < 1):
            raise ValueError(
                f"shuffle_block={block!r} must be an int >= 1 (examples per block), or None "
                "to shuffle single examples."
            )
        if window is not None and (not _count(window) or window < 1):
            raise ValueError(f"shuffle_window={window!r} must be an int >= 1 (blocks mixed).")
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

    def _check_errors(self) -> None:
        if self.on_error not in ON_ERROR:
            raise ValueError(
                f"on_error={self.on_error!r} is unknown; pass 'raise' (a bad record ends the "
                "run) or 'skip' (it becomes a masked row, within max_skipped)."
            )
        most = self.max_skipped
        fraction = isinstance(most, float) and 0 < most < 1
        if not (fraction or (_count(most) and most >= 0)):
            raise ValueError(
                f"max_skipped={most!r} must be a count (an int >= 0) or a fraction of the "
                "examples read (a float between 0 and 1, e.g. 0.01)."
            )
        if self.on_error == "raise" and most != DEFAULT_MAX_SKIPPED:
            raise ValueError(
                f"max_skipped={most!r} bounds the examples on_error='skip' skips, but "
                "on_error='raise'; pass on_error='skip' too, or drop max_skipped."
            )

    @property
    def ramp(self) -> bool:
        """Whether ``global_batch_size`` is given by stages (epochs counted in examples)."""
        return not _count(self.global_batch_size)

    @property
    def window(self) -> int:
        """Blocks mixed together with ``shuffle_block`` (``SHUFFLE_WINDOW`` by default)."""
        return SHUFFLE_WINDOW if self.shuffle_window is None else self.shuffle_window

    def _check_records(self) -> None:
        fn, workers = self.record_transform, self.num_workers
        if fn is not None and not callable(fn):
            raise TypeError(
                f"record_transform={fn!r} must be a function fn(record, rng) -> record."
            )
        if not _count(workers) or workers < 0:
            raise ValueError(f"num_workers={workers!r} must be an int >= 0.")
        if workers and fn is None:
            raise ValueError(
                f"num_workers={workers} runs record_transform in worker processes, but no "
                "record_transform was given; pass one, or num_workers=0."
            )
        if not isinstance(self.worker_type, RayOptions) and self.worker_type not in WORKER_TYPES:
            raise ValueError(
                f"worker_type={self.worker_type!r} is unknown; pass 'processes', 'threads', "
                "'ray' or meshfeed.RayOptions(...)."
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


def _check_sharding_kind(sharding: object) -> None:
    if isinstance(sharding, Mapping):
        if not sharding:
            raise ValueError("sharding is an empty mapping; name a sharding for every field.")
    elif isinstance(sharding, PartitionSpec):
        raise TypeError(
            f"sharding is a PartitionSpec {sharding}, which names no mesh; pass "
            f"NamedSharding(mesh, {sharding}) or meshfeed.batch_sharding(mesh)."
        )
    elif not isinstance(sharding, NamedSharding):
        raise TypeError(
            f"sharding is a {type(sharding).__name__}; pass a jax.sharding.NamedSharding "
            "(e.g. meshfeed.batch_sharding(mesh)) or a mapping field -> NamedSharding."
        )


def check_source_kind(source: object) -> None:
    """Raises unless ``source`` is a ``meshfeed.Source``."""
    if not isinstance(source, Source):
        raise TypeError(
            f"source is a {type(source).__name__}, not a meshfeed.Source; wrap arrays in "
            "meshfeed.ArraySource({'x': x, 'y': y}), or give it __len__, __getitem__(ids) "
            "and fields."
        )


def bound(source: Source, options: LoaderOptions) -> Source:
    """``source``, bound to the loader's steps where it counts them (``Mixture.bind``)."""
    bind = getattr(source, "bind", None)
    return cast(Source, bind(options.batch_sizes)) if callable(bind) else source


def check_source(source: Source, options: LoaderOptions) -> dict[str, FieldSpec]:
    """Checks ``source`` against ``options``; returns its fields."""
    n, sizes = len(source), options.batch_sizes
    b = sizes.size(0)
    if n == 0:
        raise ValueError(
            "source has 0 examples; pass a source with at least global_batch_size examples."
        )
    # A fixed size drops each epoch's partial batch; a ramp only the run's last.
    total = n * (options.num_epochs or 1) if options.ramp else n
    if options.last_batch == "drop" and total < b:
        raise ValueError(
            f"global_batch_size={b} exceeds the {total} examples of the source, so "
            "last_batch='drop' leaves no step; pass a smaller global_batch_size or "
            "last_batch='pad'."
        )
    if getattr(source, "ordered", False):
        _check_ordered(options)
    fields = dict(source.fields)
    # A transform may rename fields and change shapes: its output is checked on the
    # first batch instead.
    transformed = options.transform is not None or options.record_transform is not None
    sharding = options.sharding
    if isinstance(sharding, NamedSharding):
        named: dict[str, Any] = dict.fromkeys(fields, sharding)
    else:
        named = dict(sharding)
        if not transformed:
            unknown = [k for k in named if k not in fields and k != MASK]
            missing = [k for k in fields if k not in named]
            if unknown or missing:
                raise ValueError(
                    f"sharding names fields {list(named)} but the source has {list(fields)} "
                    f"(unknown: {unknown}, missing: {missing}); name each source field once."
                )
    for name, s in named.items():
        spec = fields.get(name)
        for size in sizes.distinct:  # every size of a ramp, before the first step
            check_sharding(
                s,
                name=name,
                global_batch_size=size,
                shape=None if transformed or spec is None or spec.ragged else spec.shape,
            )
    return fields


def _check_ordered(options: LoaderOptions) -> None:
    """A source whose positions must be read in order (a mixture with stages)."""
    if options.shuffle:
        raise ValueError(
            "the source changes its mixture weights by stage, so its positions must reach "
            "the batches in step order; it shuffles inside each of its sources already "
            "(mix(..., seed=)). Pass shuffle=False."
        )
    if options.num_epochs != 1:
        raise ValueError(
            f"num_epochs={options.num_epochs!r}: a mixture with stages is one pass in step "
            "order, and a second epoch would start its stages over; pass num_epochs=1 and "
            "give the mixture the length to train on (mix(..., length=))."
        )


class Option(Generic[T]):
    """A read-only attribute that reads the same-named field of its owner's ``options``."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, obj: None, owner: type) -> Option[T]: ...

    @overload
    def __get__(self, obj: object, owner: type) -> T: ...

    def __get__(self, obj: object, owner: type) -> Any:
        if obj is None:
            return self
        return getattr(obj.options, self._name)  # type: ignore[attr-defined]

    def __set__(self, obj: object, value: object) -> None:
        raise AttributeError(
            f"{type(obj).__name__}.{self._name} is read-only: the loader read it once, when "
            f"it was built; build a new Loader with {self._name}={value!r} instead."
        )


class OptionAttributes:
    """``LoaderOptions``' fields as read-only attributes of the object that holds them
    (as ``options``): ``loader.seed`` reads ``loader.options.seed``, and
    ``loader.seed = 5`` raises instead of silently changing nothing."""

    global_batch_size: Option[BatchSizeArg] = Option()
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
    place_threads: Option[PlaceThreads] = Option()
    check_every: Option[int | None] = Option()
    record_transform: Option[RecordFn | None] = Option()
    num_workers: Option[int] = Option()
    worker_type: Option[WorkerType] = Option()
    on_error: Option[OnError] = Option()
    max_skipped: Option[int | float] = Option()
