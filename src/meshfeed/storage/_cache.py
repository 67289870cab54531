"""Objects behind a URL, kept whole on local disk for the epochs that read them again.

``ShardCache(directory, max_bytes)`` is what ``open_source(url, cache_dir=...,
cache_bytes=...)`` builds. The first read of an object downloads it whole (in requests
of at most 16 MiB, in flight together) to a temporary file that is renamed into place,
so a reader -- another thread, process or job on the same disk -- sees a whole copy or
none. Later reads are ``pread`` on the copy. A copy's modification time is its last
use; before a download, the least recently used copies in the directory (whoever wrote
them) are deleted until the new one fits in ``max_bytes`` (with this process's downloads
in progress; processes sharing a directory may together exceed it by their downloads in
flight). An object larger than
``max_bytes`` is not cached: it is read by byte range as without a cache. A copy deleted
by another process between lookup and read is downloaded again.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from meshfeed.storage._remote import FETCHES

CACHE_BYTES = 16 << 30  # the bound of open_source's cache by default
CHUNK = 16 << 20  # bytes per request of a download
_TMP = ".part-"


def _name(url: str, size: int, version: str) -> str:
    digest = hashlib.sha256(f"{url}\n{size}\n{version}".encode()).hexdigest()[:20]
    return f"{digest}-{url.rstrip('/').rsplit('/', 1)[-1]}"


class ShardCache:
    """Whole objects on local disk, at most ``max_bytes`` of them, least recently used
    evicted."""

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int) -> None:
        if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 1:
            raise ValueError(f"cache_bytes={max_bytes!r} must be an int >= 1.")
        self.directory = os.fspath(directory)
        self.max_bytes = max_bytes
        os.makedirs(self.directory, exist_ok=True)
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._reserved = 0  # bytes of downloads in progress in this process

    def path(
        self,
        url: str,
        size: int,
        download: Callable[[Sequence[int], Sequence[int]], list[bytes]],
        version: str = "",
    ) -> str | None:
        """The local copy of the ``size``-byte object at ``url`` (downloaded with
        ``download(starts, ends)`` on first use), or ``None`` if it cannot fit.
        ``version`` (a checksum, say) tells apart objects rewritten at one URL."""
        if size > self.max_bytes:
            return None
        local = os.path.join(self.directory, _name(url, size, version))
        with self._lock(local):
            try:
                if os.stat(local).st_size == size:
                    os.utime(local)  # used now
                    return local
            except FileNotFoundError:
                pass
            with self._guard:  # downloads in flight here count against the bound too
                self._make_room(size + self._reserved)
                self._reserved += size
            FETCHES.add(cache_downloads=1)
            tmp = f"{local}{_TMP}{os.getpid()}-{threading.get_ident()}"
            try:
                with open(tmp, "wb") as out:
                    for at in range(0, size, 8 * CHUNK):  # 128 MiB in memory at most
                        starts = list(range(at, min(at + 8 * CHUNK, size), CHUNK))
                        ends = [min(s + CHUNK, size) for s in starts]
                        for data in download(starts, ends):
                            out.write(data)
                if os.path.getsize(tmp) != size:
                    raise OSError(f"{url} ended early while being cached: it is truncated.")
                os.replace(tmp, local)
            finally:
                with self._guard:
                    self._reserved -= size
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            return local

    def _lock(self, local: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(local, threading.Lock())

    def _make_room(self, size: int) -> None:
        copies = []
        with os.scandir(self.directory) as entries:
            for entry in entries:
                if _TMP in entry.name:  # a download in progress
                    continue
                with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
                    stat = entry.stat()
                    copies.append((stat.st_mtime, stat.st_size, entry.path))
        used = sum(c[1] for c in copies)
        for _, bytes_, path in sorted(copies):
            if used + size <= self.max_bytes:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            used -= bytes_

    @property
    def bytes(self) -> int:
        """Bytes of copies in the directory now."""
        total = 0
        with os.scandir(self.directory) as entries:
            for entry in entries:
                with contextlib.suppress(FileNotFoundError):
                    total += entry.stat().st_size if _TMP not in entry.name else 0
        return total

    def __getstate__(self) -> dict[str, Any]:  # workers make their own locks
        return {"directory": self.directory, "max_bytes": self.max_bytes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._locks = {}
        self._guard = threading.Lock()
        self._reserved = 0


_COPY_LOCK = threading.Lock()  # guards every LocalCopy's descriptor


class LocalCopy:
    """One object's copy in a ``ShardCache``, held open by the ``Blob`` that reads it.

    The kept descriptor stays open between reads and is closed only under
    ``_COPY_LOCK``, never under a read (each read gets a duplicate). A copy evicted
    meanwhile is closed (its space freed) and fetched again; its use is told to the
    cache every 30 s.
    """

    def __init__(self) -> None:
        self._held: tuple[int, str] | None = None  # (fd, path) of the copy
        self._touched = 0.0

    @property
    def present(self) -> bool:
        return self._held is not None

    def descriptor(self, download: Callable[[], str | None]) -> int | None:
        """A descriptor of the copy for the caller to close, the copy fetched by
        ``download`` (its local path, or ``None`` when too big to cache) on first use."""
        with _COPY_LOCK:
            if self._held is not None and os.fstat(self._held[0]).st_nlink == 0:
                fd, self._held = self._held[0], None  # evicted: let its space go
                os.close(fd)
            if self._held is not None:
                if time.monotonic() - self._touched > 30:
                    self._touched = time.monotonic()
                    with contextlib.suppress(FileNotFoundError):
                        os.utime(self._held[1])
                return os.dup(self._held[0])
        for attempt in range(2):  # downloads run outside the lock, several at once
            local = download()
            if local is None:
                return None  # too big to cache: read by range
            try:
                fd = os.open(local, os.O_RDONLY)
            except FileNotFoundError:  # evicted by another process meanwhile
                if attempt:
                    raise
                continue
            with _COPY_LOCK:
                if self._held is None:
                    self._held, self._touched = (fd, local), time.monotonic()
                else:  # another thread got there first
                    os.close(fd)
                return os.dup(self._held[0])
        return None

    def __del__(self) -> None:
        if getattr(self, "_held", None) is not None:
            with contextlib.suppress(OSError):
                os.close(self._held[0])  # type: ignore[index]
