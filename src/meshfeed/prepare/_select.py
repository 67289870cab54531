"""``meshfeed.select``: the examples a predicate keeps, found once, kept on disk, reused.

``select(source, keep)`` runs ``keep(record) -> bool`` once over every example -- in
``workers`` processes started bare (``_worker``, as ``prepare``'s), in Ray tasks, or in
this process -- a part at a time (``_select_part``: ~64 parts a source, handed out as
processes finish theirs), each part written as it finishes; it then writes the kept ids,
sorted (``data/_selection``: 4 bytes a kept example), and returns a ``Selection`` over
them: a source like any other, so the global shuffle, every kept example once per epoch,
the same batches on any number of processes and a state that resumes on another process
count hold for it unchanged.

The selection lives in ``cache_dir/selections/<key>``. The key hashes the predicate
pickled by value (its code, its constants, what it captures; a function of an installed
package by its name) and the source: the source pickled (the contents of its in-memory
arrays hashed as they are, without a copy), the size and modification time of every
local file or folder its pickled state names, and the bytes of up to 64 of its examples
spread over it. The same source and predicate find their selection at once; changed data
or a changed predicate a new key, so a selection is never used for data or a predicate
other than its own. A run killed half way leaves its finished parts, which a call with
the same key reuses. The default cache is ``$MESHFEED_CACHE_DIR``, else
``$XDG_CACHE_HOME/meshfeed``, else ``~/.cache/meshfeed``.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import io
import json
import os
import shutil
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from meshfeed.data._selection import Selection, kept_dtype
from meshfeed.data._sources import Source
from meshfeed.prepare._read import BadInput
from meshfeed.prepare._run import Report, run_local, run_ray, start_workers, stop_workers
from meshfeed.prepare._select_part import (
    KeepRaised,
    keep_part,
    part_count,
    part_path,
    part_size,
    ray_select_part,
)

SelectExecutor = Literal["processes", "ray"]
"""Where ``select`` runs the predicate: local worker processes, or Ray tasks."""
SAMPLES = 64  # examples read into the key
REST_S = 60.0  # how long select's workers wait for the next call
ALONE_S = {"resting": 0.1, "cold": 0.4}  # work left that this process does alone rather
# than take workers for: a resting worker starts at once, a new one takes ~0.15 s


class _SelectReport(Report):
    NAME = "select"
    COUNTS = ("examples", "kept")

    def _info(self) -> str:
        rate = self.counts["examples"] / max(1e-9, time.perf_counter() - self.start)
        return f"{self.counts['examples']:,} examples  {self.counts['kept']:,} kept  {rate:,.0f}/s"


def select(
    source: Source,
    keep: Callable[[dict[str, Any]], bool],
    *,
    workers: int | None = None,
    executor: SelectExecutor = "processes",
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool = True,
) -> Selection:
    """The examples of ``source`` that ``keep`` keeps, as a source (found once, cached).

    Args:
      source: any ``meshfeed.Source``; with ``workers`` or Ray it must pickle (a source
        over files or URLs pickles as its paths, numpy arrays as their contents).
      keep: ``keep(record) -> bool``, ``record`` a dict of one example's fields (what a
        record transform gets). Any function: a script's, a notebook's, a closure.
      workers: processes running ``keep``, this one included (it writes parts too
        rather than wait): ``2`` starts one worker process, ``0`` or ``1`` runs here
        alone. Default: one a core (here alone if the source does not pickle).
      executor: ``"processes"`` (local workers) or ``"ray"`` (a Ray task per part, on
        the cluster this process is connected to, ``RAY_ADDRESS``'s, or a local one).
      cache_dir: where selections are kept (the module docstring says the default).
      progress: a line per part written, on stderr (a bar on a terminal).

    Returns:
      a ``Selection``: ``len`` the kept count, the same fields, random access; use it
      wherever a source goes (``Loader``, ``mix``, ``pack``).

    Raises:
      ValueError: ``keep`` raised on an example (the message names it and the error);
        the parts finished before are kept, so a call after the fix goes on from there.
      TypeError: ``keep`` is not callable, or ``source`` does not pickle for workers.
    """
    if not isinstance(source, Source):
        raise TypeError(f"select's source is a {type(source).__name__}, not a meshfeed.Source.")
    if not callable(keep):
        raise TypeError(f"keep={keep!r} must be a function keep(record) -> bool.")
    if workers is not None and (
        isinstance(workers, bool) or not isinstance(workers, int) or workers < 0
    ):
        raise ValueError(f"workers={workers!r} must be an int >= 0 (0: in this process), or None.")
    if executor not in ("processes", "ray"):
        raise ValueError(f"executor={executor!r} is unknown; pass 'processes' or 'ray'.")
    keep_bytes = predicate_bytes(keep)
    parts_by = str(part_size(len(source))).encode()  # the parts are the key's too
    key = hashlib.blake2b(keep_bytes + source_key(source) + parts_by, digest_size=16).hexdigest()
    folder = os.path.join(cache_root(cache_dir), "selections", key)
    found = _load(folder, len(source))
    if found is not None:
        return Selection(source, found, key=key)
    n = len(source)
    parts = part_count(n)
    todo = [i for i in range(parts) if not os.path.exists(part_path(folder, i))]
    with _SelectReport(len(todo), show=progress and parts > 1) as report:
        try:
            _run(source, keep, keep_bytes, folder, todo, workers, executor, report)
        except (KeepRaised, BadInput) as error:
            raise ValueError(str(error)) from None
    kept = _assemble(folder, n, parts, key)
    return Selection(source, kept, key=key)


def _run(
    source: Any,
    keep: Any,
    keep_bytes: bytes,
    folder: str,
    todo: list[int],
    workers: int | None,
    executor: SelectExecutor,
    report: Report,
) -> None:
    """The parts ``todo``, written where ``workers`` and ``executor`` say: with local
    processes this one writes parts too (it would only wait otherwise), so ``workers``
    counts it and ``workers - 1`` are taken. This process writes the first part before
    any is taken: if the rest would take it less than ``ALONE_S`` (0.1 s with workers
    resting from an earlier call, 0.4 s if one must start: ~0.15 s), it writes them
    alone; a worker not started by the time the parts are written is stopped unused."""
    if not todo:
        return
    part = part_size(len(source))
    init = {"keep": keep_bytes, "folder": folder, "path": list(sys.path), "part": part}
    if executor == "ray":
        run_ray(todo, {**init, "source": _for_workers(source)}, 1, report, task=ray_select_part)
        return
    here = functools.partial(keep_part, source, keep, folder=folder, part=part)
    began = time.perf_counter()
    report.done(todo[0], here(todo[0]))
    todo = todo[1:]
    processes = (os.cpu_count() or 1) if workers is None else workers
    count = min(len(todo), processes) - 1  # workers to take: this process is one
    rest_s = (time.perf_counter() - began) * len(todo)
    if rest_s < ALONE_S["resting" if _RESTING.resting() >= count else "cold"]:
        count = 0
    if count > 0 and workers is None:
        try:
            init["source"] = _for_workers(source)
        except TypeError:  # workers were not asked for: this process alone
            count = 0
    elif count > 0:
        init["source"] = _for_workers(source)
    if count <= 0:
        for index in todo:
            report.done(index, here(index))
        return
    pool = _RESTING.take(count)
    run_local(pool, todo, init, report, here=here, keep=True)
    _RESTING.give_back(pool)


class _Resting:
    """Select workers between calls: kept ``REST_S`` after one for the next (a worker
    takes ~0.1 s to start, as long as a cheap predicate over a million examples), then
    ended. They hold nothing of the last call (its source and predicate are dropped),
    and end with this process in any case (their task pipe closes)."""

    def __init__(self) -> None:
        self._workers: list[Any] = []
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def take(self, count: int) -> list[Any]:
        """``count`` workers: resting ones first, the rest started now."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            alive = [w for w in self._workers if w.popen.poll() is None]
            taken, self._workers = alive[:count], alive[count:]
        return taken + start_workers(count - len(taken), "select")

    def resting(self) -> int:
        """Workers resting now (ready to take a call at once)."""
        with self._lock:
            return sum(w.popen.poll() is None for w in self._workers)

    def give_back(self, workers: list[Any]) -> None:
        """Workers done with a call (stopped ones are dropped); the clock restarts."""
        with self._lock:
            self._workers += [w for w in workers if w.popen.poll() is None]
            if self._workers and not self._timer:
                atexit.register(self.close)
            if self._workers:
                self._timer = threading.Timer(REST_S, self.close)
                self._timer.daemon = True
                self._timer.start()

    def close(self) -> None:
        """Ends the resting workers now."""
        with self._lock:
            workers, self._workers = self._workers, []
        stop_workers(workers)


_RESTING = _Resting()


def cache_root(cache_dir: str | os.PathLike[str] | None) -> str:
    """The cache folder: ``cache_dir``, else ``$MESHFEED_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/meshfeed``, else ``~/.cache/meshfeed``."""
    if cache_dir is not None:
        return os.fspath(cache_dir)
    if os.environ.get("MESHFEED_CACHE_DIR"):
        return os.environ["MESHFEED_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "meshfeed")


def predicate_bytes(keep: Any) -> bytes:
    """``keep`` pickled by value: its code, constants and what it captures, even where
    it lives in an importable module (a module of an installed package: by name)."""
    import cloudpickle

    name = getattr(keep, "__module__", None) or getattr(type(keep), "__module__", None)
    module = sys.modules.get(name or "")
    installed = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    file = getattr(module, "__file__", None) or ""
    by_value = module is not None and bool(file) and not any(file.startswith(p) for p in installed)
    if by_value:
        cloudpickle.register_pickle_by_value(module)
    try:
        return cloudpickle.dumps(keep)
    except Exception as error:
        raise TypeError(
            f"keep cannot be pickled ({type(error).__name__}: {error}); keep what it "
            "captures picklable (no locks, open files or sockets)."
        ) from None
    finally:
        if by_value:
            cloudpickle.unregister_pickle_by_value(module)


def _for_workers(source: Any) -> bytes:
    import cloudpickle

    try:
        return cloudpickle.dumps(source)
    except Exception as error:
        raise TypeError(
            f"the source ({type(source).__name__}) does not pickle ({type(error).__name__}: "
            f"{error}), so worker processes cannot read it; pass workers=0 to run the "
            "predicate in this process."
        ) from None


def source_key(source: Any) -> bytes:
    """What a selection's key hashes of its source (the module docstring)."""
    import cloudpickle

    digest = hashlib.blake2b(digest_size=16)
    fields = {k: [list(s.shape), str(s.dtype)] for k, s in source.fields.items()}
    digest.update(json.dumps([type(source).__qualname__, len(source), fields]).encode())
    paths: list[str] = []

    class _Pickler(cloudpickle.Pickler):
        def persistent_id(self, obj: Any) -> None:
            if isinstance(obj, str) and os.sep in obj and len(obj) < 4096 and os.path.exists(obj):
                paths.append(obj)
            return None

    def hashed(buffer: Any) -> bool:  # an array's memory: hashed where it is, not copied
        digest.update(buffer.raw())
        return True

    stream = io.BytesIO()
    try:
        _Pickler(stream, protocol=5, buffer_callback=hashed).dump(source)
    except Exception as error:  # a source that does not pickle: its examples alone
        digest.update(f"unpicklable {type(error).__name__}".encode())
    digest.update(stream.getvalue())
    for path in sorted(set(paths)):
        digest.update(json.dumps(_stamps(path)).encode())
    n = len(source)
    if n:
        ids = np.unique(np.linspace(0, n - 1, min(n, SAMPLES)).astype(np.int64))
        stream = io.BytesIO()
        cloudpickle.Pickler(stream, protocol=5, buffer_callback=hashed).dump(dict(source[ids]))
        digest.update(stream.getvalue())
    return digest.digest()


def _stamps(path: str) -> list[list[Any]]:
    """Size and modification time of the file, or of every file under the folder."""
    if os.path.isfile(path):
        stat = os.stat(path)
        return [[path, stat.st_size, stat.st_mtime_ns]]
    found = []
    for root, _, files in os.walk(path):
        for name in files:
            stat = os.stat(os.path.join(root, name))
            found.append([os.path.join(root, name), stat.st_size, stat.st_mtime_ns])
    return sorted(found)


def _load(folder: str, n: int) -> np.ndarray | None:
    """A finished selection's kept ids (a memory map), or ``None``."""
    meta_path = os.path.join(folder, "selection.json")
    if not os.path.exists(meta_path):
        return None
    with open(meta_path) as f:
        meta = json.load(f)
    if meta.get("examples") != n:
        return None
    return np.load(os.path.join(folder, "selection.npy"), mmap_mode="r")


def _assemble(folder: str, n: int, parts: int, key: str) -> np.ndarray:
    """The parts' kept ids as the selection (written, then the parts removed)."""
    try:
        kept = np.concatenate(
            [np.load(part_path(folder, i)) for i in range(parts)] or [np.zeros(0, np.int64)]
        ).astype(kept_dtype(n))
    except FileNotFoundError:  # another process assembled it and removed the parts
        found = _load(folder, n)
        if found is None:
            raise
        return found
    temporary = os.path.join(folder, f"selection.{os.getpid()}.tmp")
    with open(temporary, "wb") as f:
        np.save(f, kept)
    os.replace(temporary, os.path.join(folder, "selection.npy"))
    meta = {
        "key": key,
        "examples": n,
        "kept": len(kept),
        "stored": f"sorted ids, {kept.dtype.name}",
        "bytes_per_example": os.path.getsize(os.path.join(folder, "selection.npy")) / max(1, n),
        "part": part_size(n),
    }
    with open(temporary, "w") as f:
        json.dump(meta, f, indent=1)
    os.replace(temporary, os.path.join(folder, "selection.json"))
    shutil.rmtree(os.path.join(folder, "parts"), ignore_errors=True)
    return np.load(os.path.join(folder, "selection.npy"), mmap_mode="r")
