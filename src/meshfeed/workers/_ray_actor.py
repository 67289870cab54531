"""What a Ray record worker runs: example ids in, the source read and transformed there,
finished rows out.

A worker is a Ray actor made once per loader (``actor_class``): it imports meshfeed
without JAX, unpickles the record transform (by
value, cloudpickle) and the source (through Ray's object store, once: numpy arrays of
an in-memory source are mapped from there, not copied; a source over files or URLs
pickles as its paths and reopens them) after putting the loader's ``sys.path`` first,
as a worker process does. Each call then gets one chunk's example ids (-1: padding),
reads them from the source itself, runs the transform with each record's generator
keyed by ``(seed, epoch, example)``, and returns the chunk's rows: the same bytes as
any other worker, on any machine, however often a chunk is computed.
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from meshfeed.data._bad_records import find_bad, skippable
from meshfeed.data._sources import FieldSpec
from meshfeed.workers._record_errors import Failure, failure_of
from meshfeed.workers._record_rows import Dropped, RecordFn, dropped, transform_rows

Reply = tuple[dict[str, np.ndarray] | None, Dropped, Failure | None, float]
"""A chunk's rows, the records skipped or filtered (``Dropped``), a ``Failure`` instead
of rows when the transform or the read raised (the loader names its example), and the
seconds the chunk took (its read and transform)."""


def read_and_transform(
    fn: RecordFn,
    source: Any,
    ids: np.ndarray,
    spec: Mapping[str, FieldSpec],
    seed: int,
    epoch: int,
    skip: bool,
) -> tuple[dict[str, np.ndarray], Dropped]:
    """The rows of examples ``ids`` (zeros for padding, skipped and filtered records),
    read from ``source`` and transformed by ``fn``, and the records skipped (``skip``)
    or filtered (``Dropped``)."""
    out = {k: np.zeros((len(ids), *s.shape), s.dtype) for k, s in spec.items()}
    skipped: list[tuple[int, int, str]] = []
    valid = np.flatnonzero(ids >= 0)
    try:
        data = source[ids[valid]] if len(valid) else {}
    except Exception as error:
        if not (skip and skippable(error)):
            raise
        bad = find_bad(source.__getitem__, ids[valid], error)
        skipped = [(int(valid[at]), int(ids[valid[at]]), line) for at, line in bad]
        valid = np.delete(valid, [at for at, _ in bad])
        data = source[ids[valid]] if len(valid) else {}
    if not len(valid):
        return out, dropped(skipped, [])
    found: list[tuple[int, int, str]] | None = [] if skip else None
    filtered: list[tuple[int, int]] = []
    if len(valid) == len(ids):
        transform_rows(fn, data, ids, out, 0, seed, epoch, None, found, filtered)
        return out, dropped(skipped + (found or []), filtered)
    part = {k: np.zeros((len(valid), *s.shape), s.dtype) for k, s in spec.items()}
    transform_rows(fn, data, ids[valid], part, 0, seed, epoch, None, found, filtered)
    for name, rows in part.items():
        out[name][valid] = rows
    skipped += [(int(valid[row]), i, line) for row, i, line in found or []]
    return out, dropped(skipped, [(int(valid[row]), i) for row, i in filtered])


class RecordServer:
    """What a Ray record worker holds and does (the module docstring): the transform,
    the source, and each chunk's read and transform."""

    def __init__(self, path: list[str], fn: bytes, source: list[Any], skip: bool) -> None:
        import ray

        sys.path[:0] = [p for p in path if p not in sys.path]
        self.fn: RecordFn = pickle.loads(fn)
        self.source = ray.get(source[0])  # a list, so Ray hands over the ref, not the value
        self.skip = skip
        self.spec: Mapping[str, FieldSpec] = {}  # the output fields, sent with the first call

    def where(self) -> tuple[int, str]:
        """This worker's pid and Ray node id (the loader names them if it is lost)."""
        import ray

        return os.getpid(), ray.get_runtime_context().get_node_id()

    def run(
        self, ids: bytes | np.ndarray, spec: Mapping[str, FieldSpec] | None, seed: int, epoch: int
    ) -> Reply:
        """One chunk (``read_and_transform``) of the examples ``ids`` (int64 bytes, or an
        array) into ``spec``'s fields (``None``: those of the call before); an error comes
        back as a value."""
        began = time.perf_counter()
        if isinstance(ids, bytes):
            ids = np.frombuffer(ids, np.int64)
        if spec is not None:
            self.spec = spec
        spec = self.spec
        try:
            out, skipped = read_and_transform(
                self.fn, self.source, ids, spec, seed, epoch, self.skip
            )
        except Exception as error:
            failure = failure_of(error, ids, trace=True)
            return None, [], failure, time.perf_counter() - began
        return out, skipped, None, time.perf_counter() - began


def actor_class() -> type:
    """The Ray actor class of a record worker.

    It is made here, in a function, so that Ray sends it by value: a worker process
    then imports meshfeed bare (``_bare``: no JAX, 130 MB a worker less) before it
    reads the loader's source and transform, as a worker process does.
    """

    class RecordWorker:
        def __init__(self, *args: Any) -> None:
            import importlib
            import importlib.util
            import sys
            import types

            if "meshfeed" not in sys.modules:
                spec = importlib.util.find_spec("meshfeed")  # finds it, imports nothing
                assert spec is not None and spec.submodule_search_locations
                package = types.ModuleType("meshfeed")
                package.__path__ = list(spec.submodule_search_locations)
                sys.modules["meshfeed"] = package
                importlib.import_module("meshfeed.workers._bare").load_on_use(package)
            server = importlib.import_module("meshfeed.workers._ray_actor").RecordServer
            self.server = server(*args)

        def where(self) -> tuple[int, str]:
            return self.server.where()

        def run(self, *args: Any) -> Any:
            return self.server.run(*args)

    return RecordWorker
