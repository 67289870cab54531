"""The source checked against a loader's options, before anything starts.

``check_source_kind`` refuses what is not a ``Source``; ``bound`` binds a mixture by
stage to the loader's steps; ``check_source`` checks the source's length against the
batch size and the shardings against its fields, so a ``Loader`` either gets fully
valid input or raises before any thread, worker process or array exists.
"""

from __future__ import annotations

from typing import Any, cast

from jax.sharding import NamedSharding

from meshfeed.core._mesh import check_sharding
from meshfeed.data._sources import FieldSpec, Source
from meshfeed.feed._options import LoaderOptions
from meshfeed.feed._schedule import MASK


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
    n = len(source)
    sizes = options.batch_sizes
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
