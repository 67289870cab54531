"""Open files, bounded per process: ``HANDLES``, least recently used closed first.

A source over many shard files used to keep every file it had read open, so a folder of
2,048 shards of 2 fields read with a global shuffle ran out of descriptors under the
soft limit of 1,024 that many machines still set (``OSError: [Errno 24] Too many open
files``). Every local descriptor a ``Blob`` reads through now comes from one pool per
process that keeps at most ``limit()`` open: a file is opened on its first read, kept
while it is read again, and closed when it has been the least recently used of the
pool's files and another one needs the place.

A read *pins* its descriptor (``use``) for as long as it reads, so no other thread can
close it under it (a descriptor number closed and reused would read another file); a
file the pool would have to go over its bound for waits until a read lets one go.

The bound is ``DEFAULT_MAX_OPEN_FILES`` (128), or the ``max_open_files`` of the last
source opened with one (``limit_open_files``), and never more than half the soft
``RLIMIT_NOFILE`` (the other half is the process's: sockets, pipes, the libraries' own
files).

Once the pool has reached its bound, a small file not in it is *held* instead: read
whole (``SMALL_FILE`` bytes at most; its descriptor, closed at once, takes a place
within the bound while it reads) and kept by its bytes, while the held bytes stay within
``HELD_BYTES`` (least recently used dropped first). A global shuffle over more small
files than the bound would otherwise open and close a file for nearly every read (~4
us, against ~1 us for the read itself); reading a small file whole costs about what
reading part of it does, and later reads of it are copies from memory.
"""

from __future__ import annotations

import collections
import itertools
import os
import threading
from collections.abc import Callable

from meshfeed.core._lru import SizedLRU

DEFAULT_MAX_OPEN_FILES = 128
SMALL_FILE = 64 << 10
"""The largest file held by its bytes past the bound (whole, it reads in ~2.5 us here)."""
HELD_BYTES = 64 << 20
"""The most bytes of small files a process holds (its least recently used dropped first)."""
_HELD_OVERHEAD = 64  # a bytes object's own, and its place in the LRU


def soft_limit() -> int | None:
    """The process's soft ``RLIMIT_NOFILE`` (``None`` where there is none to read)."""
    try:
        import resource
    except ImportError:  # not POSIX
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


class Handles:
    """At most ``limit()`` descriptors open at once, by key; LRU ones closed first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # taken in C: a Condition's own "with" is Python
        self._freed = threading.Condition(self._lock)  # a pinned descriptor let go
        self._open: collections.OrderedDict[int, list[int]] = collections.OrderedDict()
        self._asked = DEFAULT_MAX_OPEN_FILES
        self._limit: int | None = None  # limit(), read once (a system call)
        self._waiting = 0  # reads waiting for a descriptor to be let go
        self._gone: collections.deque[int] = collections.deque()  # keys whose owner is gone
        self._full = False  # the pool has reached its bound: small files are held past it
        self._reading_whole = 0  # descriptors open to read a small file whole (in the bound)
        self.held = HeldFiles()  # small files kept by their bytes past the bound
        self.opened = 0  # files opened so far (again after a close, and to hold, included)

    def limit(self) -> int:
        """The most descriptors this pool keeps open now."""
        if self._limit is None:
            soft = soft_limit()
            self._limit = max(1, min(self._asked, soft // 2) if soft else self._asked)
        return self._limit

    def ask(self, max_open_files: int) -> None:
        """Keeps at most ``max_open_files`` open from now on (within half the soft limit)."""
        with self._lock:
            self._asked = max_open_files
            self._limit = None
            self._shrink()
            self._full = len(self._open) >= self.limit()

    def __len__(self) -> int:
        return len(self._open)

    def whole(self, key: int, opener: Callable[[], int]) -> bytes | None:
        """The bytes of ``key``'s file (of ``SMALL_FILE`` bytes at most) where it is held,
        or read whole and held now, if the pool has reached its bound and the file is
        not in it (``opener``'s descriptor, counted within the bound, is closed at once);
        ``None`` otherwise (and for a file grown past ``SMALL_FILE``: read by descriptor)."""
        data = self.held.get(key)
        if data is not None or not self._full or key in self._open:
            return data
        with self._lock:
            self._make_room()
            self._reading_whole += 1
        try:
            fd = opener()
            try:
                data = os.pread(fd, SMALL_FILE + 1, 0)
            finally:
                os.close(fd)
        finally:
            with self._lock:
                self._reading_whole -= 1
                self.opened += 1
                if self._waiting:
                    self._freed.notify_all()
        if len(data) > SMALL_FILE:
            return None
        self.held.put(key, data)
        return data

    def use(self, key: int, opener: Callable[[], int]) -> Pinned:
        """The descriptor of ``key`` (``opener()`` opens it when it is not open), pinned
        while the ``with`` block that takes it runs."""
        return Pinned(self, key, opener)

    def pin(self, key: int, opener: Callable[[], int]) -> list[int]:
        """``key``'s entry ``[descriptor, pins]``, pinned once more (``unpin`` lets go)."""
        with self._lock:
            if self._gone:
                self._close_gone()
            entry = self._open.get(key)
            if entry is None:
                self._make_room()
                entry = self._open[key] = [opener(), 0]
                self.opened += 1
                self._full = self._full or len(self._open) >= self.limit()
            else:
                self._open.move_to_end(key)
            entry[1] += 1
            return entry

    def unpin(self, entry: list[int]) -> None:
        with self._lock:
            entry[1] -= 1
            if entry[1] == 0 and len(self._open) > self.limit():
                self._shrink()
            if self._waiting:
                self._freed.notify_all()

    def forget(self, key: int) -> None:
        """``key``'s owner is gone: its descriptor is closed at the next ``pin``. Taking no
        lock, as it runs from a finalizer, which the collector may call anywhere -- inside
        ``pin`` itself, say (keys are never reused, so a later owner gets none of it)."""
        self._gone.append(key)

    def _make_room(self) -> None:
        """Under the lock: room for one more descriptor, closing the least recently used
        (or waiting for a read to let one go)."""
        if self._gone:
            self._close_gone()
        while len(self._open) + self._reading_whole >= self.limit() and not self._close_one():
            self._waiting += 1  # every descriptor is being read: wait for one
            self._freed.wait()
            self._waiting -= 1

    def _close_gone(self) -> None:
        while self._gone:
            key = self._gone.popleft()
            self.held.drop(key)
            entry = self._open.get(key)
            if entry is not None and entry[1] == 0:
                del self._open[key]
                os.close(entry[0])

    def _close_one(self) -> bool:
        for key, (fd, pins) in self._open.items():  # least recently used first
            if pins == 0:
                del self._open[key]
                os.close(fd)
                return True
        return False

    def _shrink(self) -> None:
        while len(self._open) > self.limit() and self._close_one():
            pass

    def after_fork(self) -> None:
        """In a forked child: a lock of its own, no reads in flight (the descriptors it
        inherited stay, each still its file's)."""
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)
        self._waiting = self._reading_whole = 0
        self.held.after_fork()
        for entry in self._open.values():
            entry[1] = 0


class HeldFiles(SizedLRU[bytes]):
    """Small files' bytes by key, within ``HELD_BYTES``: the least recently used dropped."""

    def __init__(self) -> None:
        super().__init__(HELD_BYTES, _held_size)

    @property
    def budget(self) -> int:
        return HELD_BYTES  # read at each put: the module's setting


def _held_size(data: bytes) -> int:
    return len(data) + _HELD_OVERHEAD


class Pinned:
    """``with HANDLES.use(key, opener) as fd``: the descriptor, pinned in the block."""

    __slots__ = ("_entry", "_key", "_opener", "_pool")

    def __init__(self, pool: Handles, key: int, opener: Callable[[], int]) -> None:
        self._pool = pool
        self._key = key
        self._opener = opener
        self._entry: list[int] = []

    def __enter__(self) -> int:
        self._entry = self._pool.pin(self._key, self._opener)
        return self._entry[0]

    def __exit__(self, *_: object) -> None:
        self._pool.unpin(self._entry)


KEYS = itertools.count()
"""Keys for ``HANDLES``, one per owner and never reused (an ``id`` is, once its object is gone)."""

HANDLES = Handles()
"""The process's pool of open files (a forked or spawned worker starts its own)."""
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=HANDLES.after_fork)


def limit_open_files(max_open_files: int | None) -> None:
    """Checks a source's ``max_open_files`` argument and sets the process's bound (``None``
    leaves it)."""
    if max_open_files is None:
        return
    n = max_open_files
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(
            f"max_open_files={max_open_files!r} must be an int >= 1 (files open at once in "
            f"this process; default {DEFAULT_MAX_OPEN_FILES})."
        )
    HANDLES.ask(max_open_files)
