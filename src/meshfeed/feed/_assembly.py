"""The loader's parts, built from its checked options: schedule, plan, strategy, reader.

``assemble`` wires the pieces in the order a batch meets them -- the ``Schedule`` gives
each step's example ids, the planner picks the strategy (``"auto"`` included), the
strategy's ``Builder`` says which rows this process reads and places them, the
``StepReader`` reads and transforms those rows, and the ``Stream`` reads steps ahead and
hands them out -- so that ``Loader`` is only the façade users see. Nothing here starts a
thread: the workers of a record transform start on the first read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from meshfeed.data._sources import FieldSpec, Source
from meshfeed.feed._options import LoaderOptions
from meshfeed.feed._plan import Field, Plan, make_plan
from meshfeed.feed._reader import SourceRows, StepReader, make_reader
from meshfeed.feed._schedule import Schedule
from meshfeed.feed._shardings import FieldShardings, ShardingArg, fit_to_rank, load_shardings
from meshfeed.feed._strategies import BUILDERS
from meshfeed.feed._stream import Stream


@dataclasses.dataclass(frozen=True)
class Assembly:
    """A loader's working parts (``assemble``)."""

    schedule: Schedule
    end: int | None
    """The step after the last one (``None``: endless)."""
    load_sharding: ShardingArg
    plan: Plan
    row_sets: list[Any]
    reader: StepReader
    stream: Stream

    def process_ids(self, step: int) -> np.ndarray | None:
        """The example ids this process reads for ``step`` (no padding); None past the end."""
        if self.end is not None and step >= self.end:
            return None
        ids = np.concatenate([self.schedule.ids(step)[rows] for rows in self.row_sets])
        return ids[ids >= 0]


def assemble(source: Source, fields: Mapping[str, FieldSpec], options: LoaderOptions) -> Assembly:
    """The parts of a loader over ``source`` with ``options`` (already checked)."""
    b, sharding = options.global_batch_size, options.sharding
    schedule = Schedule(
        len(source),
        b,
        shuffle=options.shuffle,
        seed=options.seed,
        last_batch=options.last_batch,
        block=options.shuffle_block,
        window=options.window,
    )
    epochs = options.num_epochs
    end = None if epochs is None else epochs * schedule.steps_per_epoch
    reshard = options.strategy == "reshard"
    load_sharding = load_shardings(sharding, b) if reshard else sharding
    plan = make_plan(_plan_fields(sharding, fields), b, requested=options.strategy)
    builder = BUILDERS[plan.strategy]  # type: ignore[index]
    target = FieldShardings(load_sharding, b)
    row_sets = builder.reads(target)
    reader = make_reader(SourceRows(source, fields, schedule), options, row_sets, target)
    stream = Stream(
        reader.read,
        lambda host: builder.place(host, target),
        end=end,
        prefetch=options.prefetch,
        prefetch_bytes=options.prefetch_bytes,
        check_every=options.check_every,
    )
    return Assembly(schedule, end, load_sharding, plan, row_sets, reader, stream)


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
