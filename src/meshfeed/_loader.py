"""The Loader: a source, a schedule, a strategy, and a position in the stream.

``Loader`` yields one dict of global ``jax.Array`` per step, laid out by the requested
sharding. Its whole state is the number of steps consumed plus a fingerprint of what
the schedule depends on; since every process derives the schedule on its own, that
state restores exactly under any number of processes or devices.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from meshfeed._mesh import check_sharding, launched_without_initialize
from meshfeed._pipeline import Prefetcher
from meshfeed._plan import Field, Plan, make_plan
from meshfeed._records import RecordFn, RecordStage
from meshfeed._replicas import check_replicas
from meshfeed._schedule import LastBatch, Schedule
from meshfeed._sources import FieldSpec, Source
from meshfeed._strategies import (
    BUILDERS,
    MASK,
    STRATEGIES,
    Layout,
    ShardingArg,
    Strategy,
    fit_to_rank,
    load_layout,
)

STATE_FORMAT = "meshfeed.loader/1"
Transform = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
_LAST_BATCH = ("drop", "pad")


class Loader:
    """Global sharded batches from a source, on one process or many.

    Args:
      source: a ``meshfeed.Source`` (``len``, ``source[ids]``, ``fields``).
      global_batch_size: rows of one step over all processes.
      sharding: a ``NamedSharding`` for every field, or a mapping field -> sharding.
        The batch dimension is the first; it must split evenly over its mesh axes.
      strategy: ``"per_process"`` (default), ``"global"``, ``"per_device"``,
        ``"reshard"`` or ``"auto"``; see ``meshfeed._strategies``. With ``"reshard"``
        batches arrive in ``loader.load_sharding``; move them with
        ``meshfeed.reshard(batch, loader.sharding)``, inside or outside ``jax.jit``.
      shuffle: a keyed random order per epoch; else ``0 .. N-1``.
      seed: the key of that order.
      num_epochs: passes over the source; ``None`` for endless.
      last_batch: ``"drop"`` skips each epoch's final partial batch; ``"pad"`` fills it
        with zero rows and adds a boolean ``mask`` field (True for real rows) to every
        batch.
      transform: a row-wise, vectorised function on the numpy dict of the rows a
        process loads, applied before they go to devices. It must keep the row count.
      prefetch: steps read ahead (source, record transforms, ``transform``) on a
        background thread (0: read each on demand). Batches are placed on devices as
        they are handed out, which JAX overlaps with the step before. ``state()``
        counts only the batches handed out.
      check_every: run ``meshfeed.check_replicas`` on every N-th batch (a collective that
        compares replicas across processes; raises ``ValueError`` if they differ).
      record_transform: ``fn(record, rng) -> record`` run on every example a process
        loads (decode, augment), before ``transform``; ``record`` maps field -> that
        example's value, ``rng`` a generator seeded from ``(seed, epoch, example_id)``.
        Every output record must have the same fields, shapes and dtypes.
      num_workers: worker processes for ``record_transform`` (0: in the loading thread).
        The output does not depend on it. ``fn`` must be picklable (module level).

    Example:
      >>> mesh = meshfeed.make_mesh(data=8)  # doctest: +SKIP
      >>> loader = meshfeed.Loader(src, global_batch_size=256,  # doctest: +SKIP
      ...                          sharding=meshfeed.batch_sharding(mesh))
      >>> for batch in loader: ...  # doctest: +SKIP
    """

    def __init__(
        self,
        source: Source,
        *,
        global_batch_size: int,
        sharding: ShardingArg,
        strategy: Strategy = "per_process",
        shuffle: bool = True,
        seed: int = 0,
        num_epochs: int | None = 1,
        last_batch: LastBatch = "drop",
        transform: Transform | None = None,
        prefetch: int = 2,
        check_every: int | None = None,
        record_transform: RecordFn | None = None,
        num_workers: int = 0,
    ) -> None:
        _check_args(source, global_batch_size, strategy, seed, num_epochs, last_batch, transform)
        why = launched_without_initialize()
        if why is not None:
            raise RuntimeError(why)
        if not isinstance(prefetch, int) or isinstance(prefetch, bool) or prefetch < 0:
            raise ValueError(
                f"prefetch={prefetch!r} must be an int >= 0 (0 reads each batch on demand)."
            )
        _check_records(record_transform, num_workers)
        if check_every is not None and (not isinstance(check_every, int) or check_every < 1):
            raise ValueError(
                f"check_every={check_every!r} must be an int >= 1 (steps between replica "
                "checks), or None for no checks."
            )
        num_examples = len(source)
        if num_examples == 0:
            raise ValueError(
                "source has 0 examples; pass a source with at least global_batch_size examples."
            )
        if last_batch == "drop" and num_examples < global_batch_size:
            raise ValueError(
                f"global_batch_size={global_batch_size} exceeds the {num_examples} examples "
                "of the source, so last_batch='drop' leaves no step; pass a smaller "
                "global_batch_size or last_batch='pad'."
            )
        fields = dict(source.fields)
        _check_shardings(sharding, fields, global_batch_size, transform is not None)

        self.source = source
        self.global_batch_size = global_batch_size
        self.sharding = sharding
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.num_epochs = num_epochs
        self.last_batch = last_batch
        self.transform = transform
        self.prefetch = prefetch
        self.check_every = check_every
        self.record_transform = record_transform
        self.num_workers = num_workers
        self._fields = fields
        self._schedule = Schedule(
            num_examples, global_batch_size, shuffle=self.shuffle, seed=seed, last_batch=last_batch
        )
        self.load_sharding = (
            load_layout(sharding, global_batch_size) if strategy == "reshard" else sharding
        )
        self._layout = Layout(self.load_sharding, global_batch_size)
        self.plan: Plan = make_plan(
            _plan_fields(sharding, fields), global_batch_size, requested=strategy
        )
        self.strategy: str = self.plan.strategy
        self._builder = BUILDERS[self.strategy]
        self._reads = self._builder.reads(self._layout)
        self._records: RecordStage | None = None
        if record_transform is not None:
            self._records = RecordStage(
                record_transform,
                num_workers=num_workers,
                seed=seed,
                read=lambda step, rows: self._source_rows(self._schedule.ids(step), rows),
                epoch_of=lambda step: self._schedule.epoch_and_step(step)[0],
                end=self._end(),
                ahead=max(1, prefetch),
            )
        self._step = 0
        self._checked_output = False

    # -- the stream -----------------------------------------------------------------

    @property
    def steps_per_epoch(self) -> int:
        return self._schedule.steps_per_epoch

    @property
    def step(self) -> int:
        """Global steps consumed so far (what ``state()`` records)."""
        return self._step

    def __len__(self) -> int:
        if self.num_epochs is None:
            raise TypeError("the loader is endless (num_epochs=None) and has no len().")
        return self.num_epochs * self.steps_per_epoch

    def _end(self) -> int | None:
        return None if self.num_epochs is None else len(self)

    def __iter__(self) -> Iterator[dict[str, jax.Array]]:
        """Yields batches from the current step to the end of the run.

        The loader holds the position: a loop that stops early, then a new loop,
        continues where the first left off; ``reset()`` starts over.
        """
        end = self._end()
        if self.prefetch == 0:
            while end is None or self._step < end:
                batch = self._checked(self._step, self.batch(self._step))
                self._step += 1
                yield batch
            return
        if not self._checked_output and (end is None or self._step < end):
            # The first batch is read here, so output that cannot be placed (a transform
            # that changes the row count, variable-length values) fails before any thread.
            batch = self._checked(self._step, self.batch(self._step))
            self._step += 1
            yield batch
            if end is not None and self._step >= end:
                return
        ahead = self._prefetcher(end)
        try:
            while True:
                try:
                    step, host = next(ahead)
                except StopIteration:
                    return
                if step != self._step:  # restore() or reset() while iterating
                    ahead.close()
                    ahead = self._prefetcher(end)
                    continue
                batch = self._checked(step, self._builder.place(host, self._layout))
                self._step = step + 1
                yield batch
        finally:
            ahead.close()

    def _prefetcher(self, end: int | None) -> Prefetcher:
        return Prefetcher(self._host, start=self._step, end=end, depth=self.prefetch)

    def _checked(self, step: int, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
        # In the consuming thread, in step order: a collective must run in the same
        # order on every process.
        if self.check_every and step % self.check_every == 0:
            check_replicas(batch)
        return batch

    def batch(self, step: int) -> dict[str, jax.Array]:
        """The global batch of ``step``, without moving the loader's position."""
        return self._builder.place(self._host(step), self._layout)

    def _host(self, step: int) -> list[dict[str, np.ndarray]]:
        """The numpy rows of ``step`` this process reads, one dict per row set."""
        ids = self._schedule.ids(step)
        return [self._read(ids, rows, step) for rows in self._reads]

    def ids(self, step: int) -> np.ndarray:
        """The example ids of global step ``step`` (``-1`` marks padding)."""
        return self._schedule.ids(step).copy()

    def _source_rows(
        self, batch_ids: np.ndarray, rows: np.ndarray
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The source's values for these batch rows (zeros for padding), and their ids."""
        ids = batch_ids if len(rows) == len(batch_ids) else batch_ids[rows]
        valid = ids >= 0
        if valid.all():
            return self.source[ids], ids
        data = {
            name: np.zeros((len(ids), *spec.shape), spec.dtype)
            for name, spec in self._fields.items()
        }
        if valid.any():
            for name, array in self.source[ids[valid]].items():
                data[name][valid] = array
        return data, ids

    def _read(self, batch_ids: np.ndarray, rows: np.ndarray, step: int) -> dict[str, np.ndarray]:
        if self._records is not None:
            data, ids = self._records(step, rows)
        else:
            data, ids = self._source_rows(batch_ids, rows)
        if self.transform is not None:
            data = self.transform(data)
        if not self._checked_output:
            self._check_output(data, len(ids))
        if self.last_batch == "pad":
            data = {**data, MASK: ids >= 0}
        return data

    def close(self) -> None:
        """Stops ``record_transform`` workers and frees their shared memory."""
        if self._records is not None:
            self._records.close()

    def _check_output(self, data: object, rows: int) -> None:
        who = "transform" if self.transform is not None else "source"
        if not isinstance(data, Mapping) or not data:
            raise TypeError(
                f"the {who} returned {type(data).__name__}; it must return a non-empty "
                "dict of field name -> numpy array."
            )
        for name, array in data.items():
            if not isinstance(array, np.ndarray) or array.ndim == 0 or len(array) != rows:
                got = getattr(array, "shape", type(array).__name__)
                raise ValueError(
                    f"the {who} returned field {name!r} as {got} for {rows} rows; return "
                    f"one numpy row per example ({rows} rows)."
                )
            if array.dtype.hasobject:
                raise ValueError(
                    f"field {name!r} holds variable-length values (an object array) and "
                    "cannot go to devices; decode or pad it to a fixed shape with "
                    "record_transform= (per example) or transform= (per batch)."
                )
            if self.last_batch == "pad" and name == MASK:
                raise ValueError(
                    f"the {who} returned a field named {MASK!r}, which last_batch='pad' "
                    "adds itself; rename that field."
                )
            sharding = self._layout.sharding(name, array.ndim)
            check_sharding(
                sharding,
                name=name,
                global_batch_size=self.global_batch_size,
                shape=array.shape[1:],
            )
        self._checked_output = True

    def reset(self) -> None:
        """Goes back to step 0."""
        self._step = 0

    # -- state ----------------------------------------------------------------------

    def _fingerprint(self) -> dict[str, Any]:
        extra = getattr(self.source, "fingerprint", None)  # e.g. a mixture's weights
        return {
            **({"source": json.loads(json.dumps(extra))} if extra is not None else {}),
            "num_examples": len(self.source),
            "fields": {n: [list(s.shape), str(s.dtype)] for n, s in self._fields.items()},
            "seed": self.seed,
            "shuffle": self.shuffle,
            "global_batch_size": self.global_batch_size,
            "last_batch": self.last_batch,
        }

    def state(self) -> dict[str, Any]:
        """A small JSON-serialisable dict: steps consumed and what the schedule depends on."""
        return {
            "format": STATE_FORMAT,
            "step": self._step,
            **self._fingerprint(),
            "topology": {
                "process_count": jax.process_count(),
                "device_count": jax.device_count(),
            },
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Continues the stream exactly where ``state`` was taken.

        The state may come from a run with another number of processes or devices; it
        must come from the same source, seed, shuffle, batch size and last_batch.
        """
        if isinstance(state, str | bytes):
            state = json.loads(state)
        if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
            raise ValueError(
                f"restore got {type(state).__name__} without format={STATE_FORMAT!r}; pass "
                "the dict returned by Loader.state()."
            )
        mine = self._fingerprint()
        for key, value in mine.items():
            theirs = state.get(key)
            if key == "fields":
                theirs = {n: [list(s), d] for n, (s, d) in (theirs or {}).items()}
            if theirs != value:
                what = "dataset" if key in ("num_examples", "fields", "source") else key
                raise ValueError(
                    f"the state is from another {what}: {key}={theirs!r} in the state, "
                    f"{value!r} in this loader; restore it into a loader built with "
                    f"{key}={theirs!r}."
                )
        step = state.get("step")
        if not isinstance(step, int) or step < 0:
            raise ValueError(f"the state has step={step!r}; it must be an int >= 0.")
        end = self._end()
        if end is not None and step > end:
            raise ValueError(
                f"the state is at step {step}, past this loader's {end} steps; raise "
                "num_epochs to continue it."
            )
        self._step = step

    def __repr__(self) -> str:
        steps = "endless" if self.num_epochs is None else f"{len(self)} steps"
        return (
            f"Loader({self.source!r}, global_batch_size={self.global_batch_size}, "
            f"strategy={self.strategy!r}, {steps}, at step {self._step})"
        )


def _plan_fields(sharding: ShardingArg, fields: Mapping[str, FieldSpec]) -> dict[str, Field]:
    """The source's fields with their shardings, for the planner (before any transform)."""
    out = {}
    for name, spec in fields.items():
        s = sharding if isinstance(sharding, NamedSharding) else sharding.get(name)
        if s is not None:
            out[name] = (fit_to_rank(s, 1 + len(spec.shape)), spec.shape, spec.dtype)
    if not out:  # a transform renames every field: plan the rows alone
        s = sharding if isinstance(sharding, NamedSharding) else next(iter(sharding.values()))
        out["rows"] = (fit_to_rank(s, 1), (), np.dtype(np.uint8))
    return out


def _check_records(record_transform: object, num_workers: object) -> None:
    if record_transform is not None and not callable(record_transform):
        raise TypeError(
            f"record_transform={record_transform!r} must be a function fn(record, rng) -> record."
        )
    if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 0:
        raise ValueError(f"num_workers={num_workers!r} must be an int >= 0.")
    if num_workers and record_transform is None:
        raise ValueError(
            f"num_workers={num_workers} runs record_transform in worker processes, but no "
            "record_transform was given; pass one, or num_workers=0."
        )
    if num_workers:
        try:
            pickle.dumps(record_transform)
        except Exception as error:
            raise TypeError(
                f"record_transform cannot be sent to worker processes ({error}); define it at "
                "module level (not a lambda or a nested function), or pass num_workers=0."
            ) from None


def _check_args(
    source: object,
    global_batch_size: object,
    strategy: object,
    seed: object,
    num_epochs: object,
    last_batch: object,
    transform: object,
) -> None:
    if not isinstance(source, Source):
        raise TypeError(
            f"source is a {type(source).__name__}, not a meshfeed.Source; wrap arrays in "
            "meshfeed.ArraySource({'x': x, 'y': y}), or give it __len__, __getitem__(ids) "
            "and fields."
        )
    if not isinstance(global_batch_size, int) or isinstance(global_batch_size, bool):
        raise TypeError(f"global_batch_size={global_batch_size!r} must be an int.")
    if global_batch_size < 1:
        raise ValueError(f"global_batch_size={global_batch_size} must be >= 1.")
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is unknown; pass one of {list(STRATEGIES)}.")
    if last_batch not in _LAST_BATCH:
        raise ValueError(f"last_batch={last_batch!r} is unknown; pass 'drop' or 'pad'.")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed={seed!r} must be an int >= 0.")
    if num_epochs is not None and (
        not isinstance(num_epochs, int) or isinstance(num_epochs, bool) or num_epochs < 1
    ):
        raise ValueError(f"num_epochs={num_epochs!r} must be an int >= 1, or None for endless.")
    if transform is not None and not callable(transform):
        raise TypeError(f"transform={transform!r} must be a function of a dict of arrays.")


def _check_shardings(
    sharding: object, fields: Mapping[str, Any], global_batch_size: int, transformed: bool
) -> None:
    if isinstance(sharding, Mapping):
        if not sharding:
            raise ValueError("sharding is an empty mapping; name a sharding for every field.")
        named = dict(sharding)
        if not transformed:
            unknown = [k for k in named if k not in fields and k != MASK]
            missing = [k for k in fields if k not in named]
            if unknown or missing:
                raise ValueError(
                    f"sharding names fields {list(named)} but the source has {list(fields)} "
                    f"(unknown: {unknown}, missing: {missing}); name each source field once."
                )
    elif isinstance(sharding, NamedSharding):
        named = dict.fromkeys(fields, sharding)
    elif isinstance(sharding, PartitionSpec):
        raise TypeError(
            f"sharding is a PartitionSpec {sharding}, which names no mesh; pass "
            f"NamedSharding(mesh, {sharding}) or meshfeed.batch_sharding(mesh)."
        )
    else:
        raise TypeError(
            f"sharding is a {type(sharding).__name__}; pass a jax.sharding.NamedSharding "
            "(e.g. meshfeed.batch_sharding(mesh)) or a mapping field -> NamedSharding."
        )
    for name, s in named.items():
        spec = fields.get(name)
        check_sharding(
            s,
            name=name,
            global_batch_size=global_batch_size,
            shape=None if transformed or spec is None else spec.shape,
        )
