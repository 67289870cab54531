"""One file, local or behind an fsspec URL, read by byte range: ``Blob``.

Locally, ``pread``/``preadv`` on a descriptor kept open (nothing is mapped into the
process). Behind a URL, ``fetch_ranges`` (``_remote``): every range of a read in flight
together, nearby ones merged, failures named, passing faults retried. With a
``ShardCache`` (``open_source(cache_dir=...)``), the first read downloads the object
whole and later reads ``pread`` the local copy.

Every read behind a URL runs on its store's clock (``_clock``), and a Blob is where the
filesystem for a URL is built: with the storage options and the client's own retries
off (``reader_options``, ``bound_inner_retries``), so every source, format and Parquet
reader gets the same filesystem for the same options (fsspec keeps one instance per
options), and nothing retries under the clock's feet.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any, TypeVar

from meshfeed.storage._cache import ShardCache
from meshfeed.storage._clock import clock_for
from meshfeed.storage._remote import (
    FETCHES,
    RETRY_S,
    Counter,
    bound_inner_retries,
    fetch_ranges,
    reader_options,
    store_name,
    with_retries,
)

_COPY_LOCK = threading.Lock()  # guards every Blob's descriptor of its cached copy
T = TypeVar("T")


class TruncatedError(OSError):
    """A file that ends before the bytes asked for: cut short after it was opened (or
    indexed). The data's fault, not the store's, so ``on_error="skip"`` skips the
    examples it holds as bad records, where it raises every other ``OSError``."""


def is_url(path: str) -> bool:
    return "://" in path


def require_fsspec() -> Any:
    """The ``fsspec`` module, or an ``ImportError`` naming the extra to install."""
    try:
        import fsspec
    except ImportError:
        raise ImportError(
            "reading a URL needs fsspec: pip install 'meshfeed[remote]'"
            " (from a clone: pip install -e '.[remote]'; or pip install "
            "fsspec plus the filesystem's package, e.g. s3fs or gcsfs)."
        ) from None
    return fsspec


class Blob:
    """One file, local or remote, read by byte range (remote: through ``cache`` if any)."""

    def __init__(
        self,
        path: str,
        storage_options: Mapping[str, Any] | None = None,
        *,
        retry_s: float = RETRY_S,
        cache: ShardCache | None = None,
    ) -> None:
        self.path = path
        self.retry_s = retry_s
        self.fetched = Counter()  # requests and bytes through fsspec
        self.cache = cache
        self.version = ""  # the content's checksum, where a manifest gives it (for cache)
        self._fd: int | None = None
        self._copy: tuple[int, str] | None = None  # (fd, path) of the cache's copy
        self._touched = 0.0
        self._size: int | None = None
        if is_url(path):
            self._fs, self._fs_path = require_fsspec().core.url_to_fs(
                path, **reader_options(path, storage_options)
            )
            bound_inner_retries(self._fs)
        else:
            self._fs, self._fs_path = None, path

    def size(self) -> int:
        try:
            if self._fs is None:
                return os.stat(self.path).st_size
            if self._size is None:  # an object does not change size: ask once
                fs, fs_path = self._fs, self._fs_path
                self._size = int(self.retried(lambda: fs.size(fs_path)))
            return self._size
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.path} does not exist.") from None

    def open(self, **options: Any) -> IO[bytes]:
        """A binary file object over the whole file (for zip and Parquet readers);
        ``options`` go to fsspec's ``open`` for a URL (``cache_type="none"``, say)."""
        if self._fs is None:
            return open(self.path, "rb")  # the caller closes it
        return self._fs.open(self._fs_path, "rb", **options)

    def retried(self, call: Callable[[], T]) -> T:
        """``call()`` (a read of this object through ``open``, say) on the store's clock:
        asked again after a passing fault, until the store has failed for ``retry_s``."""
        if self._fs is None:
            return call()
        clock = clock_for(store_name(self._fs, self._fs_path))
        return with_retries(call, self.path, retry_s=self.retry_s, clock=clock)

    def read(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)``; fewer if the file ends first."""
        if self._fs is not None:
            return self._cat_ranges([start], [end])[0]
        return os.pread(self._open(), end - start, start)

    def read_into(self, views: Sequence[memoryview], starts: Sequence[int]) -> None:
        """Fills each view from its offset (local files: straight into the view)."""
        if self._fs is not None and self.cache is not None:
            fd = self._copy_fd()
            if fd is not None:
                FETCHES.add(cache_hits=1)
                try:
                    return _pread_into(fd, views, starts, self.path)
                finally:
                    os.close(fd)
        if self._fs is not None:
            ends = [s + len(v) for v, s in zip(views, starts, strict=True)]
            for view, data in zip(views, self._cat_ranges(starts, ends), strict=True):
                if len(data) != len(view):
                    raise TruncatedError(f"{self.path} ended early: it is truncated.")
                view[:] = data
            return
        _pread_into(self._open(), views, starts, self.path)

    @property
    def reads_locally(self) -> bool:
        """Whether reads are ``pread`` on a local file (the file, or the cache's copy)."""
        return self._fs is None or self._copy is not None

    @property
    def local_copy(self) -> bool:
        """Whether reads go to a local copy (``cache``) now, not to the store."""
        return self._copy is not None

    def _copy_fd(self) -> int | None:
        """A descriptor of the cache's copy for the caller to close (the copy downloaded on
        first use), or ``None`` when the object is too big to cache.

        The kept descriptor stays open between reads and is closed only under
        ``_COPY_LOCK``, never under a read (each read gets a duplicate). A copy evicted
        meanwhile is closed (its space freed) and fetched again; its use is told to the
        cache every 30 s.
        """
        assert self.cache is not None
        with _COPY_LOCK:
            if self._copy is not None and os.fstat(self._copy[0]).st_nlink == 0:
                fd, self._copy = self._copy[0], None  # evicted: let its space go
                os.close(fd)
            if self._copy is not None:
                if time.monotonic() - self._touched > 30:
                    self._touched = time.monotonic()
                    with contextlib.suppress(FileNotFoundError):
                        os.utime(self._copy[1])
                return os.dup(self._copy[0])
        for attempt in range(2):  # downloads run outside the lock, several at once
            local = self.cache.path(self.path, self.size(), self._cat_ranges, self.version)
            if local is None:
                return None  # too big to cache: read by range
            try:
                fd = os.open(local, os.O_RDONLY)
            except FileNotFoundError:  # evicted by another process meanwhile
                if attempt:
                    raise
                continue
            with _COPY_LOCK:
                if self._copy is None:
                    self._copy, self._touched = (fd, local), time.monotonic()
                else:  # another thread got there first
                    os.close(fd)
                return os.dup(self._copy[0])
        return None

    def _cat_ranges(self, starts: Sequence[int], ends: Sequence[int]) -> list[bytes]:
        assert self._fs is not None
        return fetch_ranges(
            self._fs,
            self._fs_path,
            self.path,
            starts,
            ends,
            retry_s=self.retry_s,
            counter=self.fetched,
        )

    def _open(self) -> int:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                raise FileNotFoundError(f"{self.path} does not exist.") from None
            weakref.finalize(self, os.close, self._fd)
        return self._fd

    def __del__(self) -> None:
        if getattr(self, "_copy", None) is not None:
            with contextlib.suppress(OSError):
                os.close(self._copy[0])  # type: ignore[index]

    def __getstate__(self) -> dict[str, Any]:  # workers reopen the file themselves
        return {**self.__dict__, "_fd": None, "_copy": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._fs is not None:  # a filesystem is unpickled from its options alone
            bound_inner_retries(self._fs)


def _pread_into(fd: int, views: Sequence[memoryview], starts: Sequence[int], name: str) -> None:
    for view, at in zip(views, starts, strict=True):
        done = 0
        while done < len(view):
            got = os.preadv(fd, [view[done:]], at + done)
            if got == 0:
                raise TruncatedError(f"{name} ended early: it is truncated.")
            done += got
