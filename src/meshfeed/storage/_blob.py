"""One file, local or behind an fsspec URL, read by byte range: ``Blob``.

Locally, ``pread``/``preadv`` on a descriptor from the process's pool of open files
(``_handles``: opened on first use, closed when the least recently used of too many;
nothing is mapped into the process), or, past the pool's bound, a copy from a small
file's bytes held whole without a descriptor. Behind a URL, ``fetch_ranges``
(``_remote``): every range of a read in flight together, nearby ones merged, failures
named, passing faults retried. With a ``ShardCache`` (``open_source(cache_dir=...)``),
the first read downloads the object whole and later reads ``pread`` the local copy.

Every read behind a URL runs on its store's clock (``_clock``), and a Blob is where the
filesystem for a URL is built: with the storage options and the client's own retries
off (``reader_options``, ``bound_inner_retries``), so every source, format and Parquet
reader gets the same filesystem for the same options (fsspec keeps one instance per
options), and nothing retries under the clock's feet.

What a catalog says of a file is given to ``expect`` and checked at the file's first
read, not before (``_expect``).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any, TypeVar

from meshfeed.storage._cache import LocalCopy, ShardCache
from meshfeed.storage._clock import clock_for
from meshfeed.storage._expect import Expectation, first_range
from meshfeed.storage._handles import HANDLES, KEYS, SMALL_FILE
from meshfeed.storage._hedge import Hedger, hedger_for
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
        hedge: bool = True,
    ) -> None:
        self.path = path
        self.retry_s = retry_s
        self.hedge = hedge  # a slow range read behind a URL gets a duplicate (_hedge)
        self.fetched = Counter()  # requests and bytes through fsspec
        self.cache = cache
        self.version = ""  # the content's checksum, where a manifest gives it (for cache)
        self._copy = LocalCopy()  # the cache's copy, once downloaded
        self._expected: Expectation | None = None
        self._key = next(KEYS)  # its descriptor's in HANDLES
        weakref.finalize(self, HANDLES.forget, self._key)
        self._size: int | None = None
        self._small: bool | None = None  # a local file of SMALL_FILE bytes at most (None: unseen)
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

    def hedger(self) -> Hedger | None:
        """The hedger of this object's store (``None``: a local file, or ``hedge=False``)."""
        if self._fs is None or not self.hedge:
            return None
        store = store_name(self._fs, self._fs_path)
        return hedger_for(store, clock_for(store))

    def read(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)``; fewer if the file ends first."""
        if self._fs is not None:
            return self._cat_ranges([start], [end])[0]
        self._check_first()
        data = HANDLES.whole(self._key, self._open_fd) if self._small else None
        if data is not None:
            return data[start:end]
        with HANDLES.use(self._key, self._open_fd) as fd:  # no thread closes it under us
            return os.pread(fd, end - start, start)

    def read_all(self) -> bytes:
        """The whole file, in one request behind a URL (no size asked first): a manifest
        or a catalog, read before anything else."""
        if self._fs is None:
            with open(self.path, "rb") as f:
                return f.read()
        fs, fs_path = self._fs, self._fs_path

        def get() -> bytes:
            self.fetched.requests += 1
            FETCHES.add(requests=1)
            return fs.cat_file(fs_path, start=0)  # "bytes=0-": one GET, no HEAD

        data = self.retried(get)
        self.fetched.bytes += len(data)
        FETCHES.add(bytes=len(data))
        return data

    def expect(
        self,
        size: int | None,
        *,
        etag: str | None = None,
        check: Callable[[Blob], None] | None = None,
    ) -> None:
        """What a catalog says of this file, checked at its first read (``ChangedError``
        naming the file if it differs): its ``size`` (``None``: left to ``check``), behind
        a URL its ``etag`` where the catalog has one, and ``check(blob)`` (a header, a
        stamp) after that. Until then nothing is asked of the file."""
        self._size = size if self._fs is not None else None
        self._expected = Expectation(size, etag, check)

    @property
    def filesystem(self) -> tuple[Any, str]:
        """The fsspec filesystem and its path (``None`` and the path, locally)."""
        return self._fs, self._fs_path

    def _check_first(self) -> None:
        expected = self._expected
        if expected is not None and expected.pending:  # other threads wait for the check;
            expected.settle(self)  # its own reads come back here and pass

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
        self._check_first()
        data = HANDLES.whole(self._key, self._open_fd) if self._small else None
        if data is not None:
            return _copy_into(data, views, starts, self.path)
        with HANDLES.use(self._key, self._open_fd) as fd:  # no thread closes it under us
            _pread_into(fd, views, starts, self.path)

    @property
    def reads_locally(self) -> bool:
        """Whether reads are ``pread`` on a local file (the file, or the cache's copy)."""
        return self._fs is None or self._copy.present

    @property
    def local_copy(self) -> bool:
        """Whether reads go to a local copy (``cache``) now, not to the store."""
        return self._copy.present

    def _copy_fd(self) -> int | None:
        """A descriptor of the cache's copy for the caller to close (the copy downloaded on
        first use), or ``None`` when the object is too big to cache."""
        assert self.cache is not None
        return self._copy.descriptor(
            lambda: self.cache.path(self.path, self.size(), self._cat_ranges, self.version)  # type: ignore[union-attr]
        )

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
            first=self._first_range,
            hedger=self.hedger(),
        )

    def _first_range(self, start: int, end: int) -> bytes | None:
        expected = self._expected
        if expected is None or not expected.pending:
            return None
        return first_range(self, expected, start, end)  # raises if the file changed

    def _open_fd(self) -> int:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.path} does not exist.") from None
        if self._small is None:
            self._small = os.fstat(fd).st_size <= SMALL_FILE
        return fd

    def __getstate__(self) -> dict[str, Any]:  # workers reopen the file themselves
        return {**self.__dict__, "_copy": LocalCopy()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._key = next(KEYS)  # its descriptor's in HANDLES
        weakref.finalize(self, HANDLES.forget, self._key)
        if self._fs is not None:  # a filesystem is unpickled from its options alone
            bound_inner_retries(self._fs)


def _copy_into(data: bytes, views: Sequence[memoryview], starts: Sequence[int], name: str) -> None:
    whole = memoryview(data)
    for view, at in zip(views, starts, strict=True):
        piece = whole[at : at + len(view)]
        if len(piece) != len(view):
            raise TruncatedError(f"{name} ended early: it is truncated.")
        view[:] = piece


def _pread_into(fd: int, views: Sequence[memoryview], starts: Sequence[int], name: str) -> None:
    for view, at in zip(views, starts, strict=True):
        done = 0
        while done < len(view):
            got = os.preadv(fd, [view[done:]], at + done)
            if got == 0:
                raise TruncatedError(f"{name} ended early: it is truncated.")
            done += got
