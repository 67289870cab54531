"""``meshfeed.inspect.plan``: what each strategy costs; with ``data``, what a pod asks of its store.

Without ``data`` a plan is the strategies' costs for one array (``_plan``). With
``data`` (a folder, files or a URL) it is the plan of a loader over that data, and, for
``processes`` hosts, what they will ask of the store before launching them: the data is
opened here with every request to the store counted (``counting``: on S3, each request
the client sends), which is what each host will send to start, so the pod's start-up is
that times the number of hosts; and the requests and bytes of a host's share of each of
the first steps, sampled from the source's own cost model (``source.fetches``). Against
a store's request rate (``STORE_RPS``, S3's per-prefix figure, by default) that says how
long the pod's start-up keeps the store busy, and whether a step's requests fit in it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import numpy as np
from jax.sharding import NamedSharding

from meshfeed.data._sources import Source
from meshfeed.feed._loader import Loader
from meshfeed.feed._plan import Plan, PodCost, make_plan
from meshfeed.storage._remote import counting

STORE_RPS = 5_500.0
"""Requests a second a store serves, by default: S3's GET/HEAD rate per prefix (past it,
503 SlowDown)."""
SAMPLED_STEPS = 8


def plan(
    sharding: NamedSharding,
    shape: Sequence[int] | None = None,
    dtype: Any = np.float32,
    *,
    processes: int | None = None,
    data: str | os.PathLike[str] | Sequence[str] | None = None,
    global_batch_size: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    store_rps: float = STORE_RPS,
    loader_options: Mapping[str, Any] | None = None,
) -> Plan:
    """What each strategy costs for one array of global ``shape`` laid out by ``sharding``;
    with ``data``, for a loader over that data, and what ``processes`` hosts ask of its
    store.

    Args:
      sharding: the target ``NamedSharding``; dimension 0 is the batch.
      shape: the global shape, ``(global_batch_size, ...)`` (without ``data``).
      dtype: the element type (without ``data``).
      processes: plan as if the mesh's devices were split, in order, over this many
        processes (default: the processes running here); with ``data``, the hosts the
        pod's figures are for.
      data: a meshfeed folder, ``.npy``, or tar / JSON Lines / TFRecord / Parquet files
        (paths, globs or URLs): opened here, its requests counted.
      global_batch_size: with ``data``, the rows of a step (default 256).
      storage_options: with ``data`` behind a URL, as ``open_source`` takes them.
      store_rps: the store's requests a second, for the pod's figures.
      loader_options: with ``data``, more ``Loader`` arguments (``shuffle_block``, ...).

    Returns:
      A ``Plan``: ``plan.costs[strategy]`` per strategy, ``plan.choice`` and
      ``plan.reason`` for ``"auto"``; with ``data``, ``plan.fetches`` (this process's
      requests a step) and ``plan.pod`` (a ``PodCost``); ``meshfeed.show_plan(plan)``
      draws them.

    Example:
      >>> p = meshfeed.inspect.plan(  # doctest: +SKIP
      ...     sharding, data="s3://bucket/ds", processes=4096)
      >>> p.pod.pod_startup_requests  # doctest: +SKIP
    """
    if not isinstance(sharding, NamedSharding):
        raise TypeError(f"sharding is a {type(sharding).__name__}; pass a NamedSharding.")
    if data is None:
        if shape is None:
            raise ValueError("plan needs shape=(global_batch_size, ...), or data=.")
        shape = tuple(int(d) for d in shape)
        if not shape:
            raise ValueError("shape=() has no batch dimension; pass (global_batch_size, ...).")
        return make_plan(
            {"array": (sharding, shape[1:], np.dtype(dtype))}, shape[0], processes=processes
        )
    if not isinstance(store_rps, int | float) or store_rps <= 0:
        raise ValueError(f"store_rps={store_rps!r} must be > 0 (requests a second).")
    if processes is not None and (not isinstance(processes, int) or processes < 1):
        raise ValueError(f"processes={processes!r} must be an int >= 1.")
    batch = 256 if global_batch_size is None else global_batch_size
    names = [os.fspath(data)] if isinstance(data, str | os.PathLike) else list(data)
    with counting(names[0], storage_options) as counts:
        source = open_data(names, storage_options)
    first_read = _first_read(names[0], storage_options, source)  # before anything reads
    loader = Loader(source, global_batch_size=batch, sharding=sharding, **(loader_options or {}))
    hosts = processes or 1
    share = max(1, batch // hosts)  # a host's rows of a step, the batch split over hosts
    per_step = [_fetches(source, loader.ids(k)[:share]) for k in range(SAMPLED_STEPS)]
    pod = PodCost(
        url=names[0] if len(names) == 1 else f"{names[0]} and {len(names) - 1} more",
        processes=hosts,
        startup={k: int(v) for k, v in counts.items() if v},
        step_requests=float(np.mean([r for r, _ in per_step])),
        step_bytes=float(np.mean([b for _, b in per_step])),
        steps=SAMPLED_STEPS,
        store_rps=float(store_rps),
        files=_file_count(source),
        first_read=first_read,
    )
    return dataclasses.replace(loader.plan, pod=pod)


def _file_count(source: Source) -> int | None:
    """The files ``source`` is stored in, where it says."""
    files = getattr(source, "files", None)
    paths = getattr(files, "paths", None) or getattr(source, "paths", None)
    if paths is not None:
        return len(paths)
    shards = getattr(source, "_shards", None)
    return len(shards) if isinstance(shards, list) else None


def _first_read(name: str, storage_options: Mapping[str, Any] | None, source: Source) -> int | None:
    """Requests a file's first read costs before its data: a row read cold, less the same
    row read again (``None`` for local data)."""
    if not getattr(source, "remote", False) or len(source) == 0:
        return None
    row = np.array([0])
    with counting(name, storage_options) as first:
        source[row]
    with counting(name, storage_options) as again:
        source[row]
    return max(0, sum(first.values()) - sum(again.values()))


def _fetches(source: Source, ids: np.ndarray) -> tuple[int, int]:
    """The requests and bytes reading ``ids`` asks a store for (none, for local data)."""
    fetches = getattr(source, "fetches", None)
    if fetches is None or not getattr(source, "remote", False):
        return 0, 0
    requests, fetched = cast(Callable[[np.ndarray], tuple[int, int]], fetches)(ids[ids >= 0])
    return int(requests), int(fetched)


def open_data(names: Sequence[str], storage_options: Mapping[str, Any] | None) -> Source:
    """The source over ``names``, by what they name: tar, JSON Lines, TFRecord or Parquet
    files, else a meshfeed folder (or a ``.npy``/``.npz``)."""
    from meshfeed.data._parquet import ParquetSource
    from meshfeed.data._store import open_source
    from meshfeed.formats._index import kind_of
    from meshfeed.formats._jsonl import JsonlSource
    from meshfeed.formats._tar import TarSource
    from meshfeed.formats._tfrecord import TFRecordSource

    first = names[0]
    if first.lower().endswith(".parquet"):
        return ParquetSource(names, storage_options=storage_options)
    kind = kind_of(first)
    if kind == "tar":
        return TarSource(names, storage_options=storage_options)
    if kind == "jsonl":
        return JsonlSource(names, storage_options=storage_options)
    if kind == "tfrecord":
        return TFRecordSource(names, storage_options=storage_options)
    if len(names) != 1:
        raise ValueError(f"data={list(names)}: a meshfeed folder is one path; pass one.")
    return open_source(first, storage_options=storage_options)
