"""What a catalog says of one file, checked at the file's first read: ``Expectation``.

A catalog gives a file's size, behind a URL its ETag, and maybe a check of its header
(``Blob.expect``). Nothing is asked of the file until its first read, so a host that
starts from a catalog sends no request per file; the file is still refused by name
(``ChangedError``) if it changed since the catalog was written. Locally the check is a
``stat``; behind an S3 URL the first read's own reply carries the object's size
(``Content-Range``) and ETag (``first_range``), so the check costs no request; behind
other URLs it costs one (``info``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar, cast

from meshfeed.storage._hedge import Hedger, hedged
from meshfeed.storage._remote import FETCHES, Counter

T = TypeVar("T")

WRITE_AGAIN = "Write the data (or its catalog: `meshfeed index`) again."


class Blob(Protocol):
    """What a check needs of a ``Blob`` (``_blob`` imports this module, not the reverse)."""

    path: str
    fetched: Counter

    @property
    def filesystem(self) -> tuple[Any, str]: ...

    def retried(self, call: Callable[[], T]) -> T: ...

    def hedger(self) -> Hedger | None: ...


class ChangedError(ValueError):
    """A file that is not what its catalog says: rewritten since the catalog was written."""


class Expectation:
    """A file's size (``None``: left to ``check``), ETag and ``check(blob)``, until the
    first read has checked them (``pending``). Every other thread's read waits for the
    check (it reads nothing a failed check would refuse); the check's own reads pass."""

    def __init__(
        self, size: int | None, etag: str | None, check: Callable[[Any], None] | None
    ) -> None:
        self.size = size
        self.etag = etag
        self.check = check
        self.pending = True
        self.lock = threading.Lock()  # one first-read check at a time
        self._checker: int | None = None  # the thread running ``check``

    def checking_here(self) -> bool:
        """Whether this thread is running the check (whose own reads must not wait)."""
        return self._checker == threading.get_ident()

    def settle(self, blob: Blob, answer: tuple[int, str | None] | None = None) -> None:
        """Check ``blob`` (``answer``: the size and ETag its first read's reply gave)."""
        if self.checking_here():
            return
        with self.lock:
            if not self.pending:
                return
            got, got_etag = (None, None) if self.size is None else answer or _ask(blob)
            if self.size is not None and got != self.size:
                raise ChangedError(
                    f"{blob.path} is {got} bytes, its catalog says {self.size}: it changed "
                    f"since the catalog was written (truncated or replaced). {WRITE_AGAIN}"
                )
            if self.etag and got_etag and got_etag.strip('"') != self.etag.strip('"'):
                raise ChangedError(
                    f"{blob.path} has ETag {got_etag}, its catalog says {self.etag}: it was "
                    f"replaced since the catalog was written. {WRITE_AGAIN}"
                )
            if self.check is not None:
                self._checker = threading.get_ident()  # it reads the file itself
                try:
                    self.check(blob)
                finally:
                    self._checker = None
            self.pending = False

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "lock": None, "_checker": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.lock = threading.Lock()


def _ask(blob: Blob) -> tuple[int, str | None]:
    """The file's size and ETag, asked: a ``stat`` locally, ``info`` behind a URL."""
    fs, fs_path = blob.filesystem
    if fs is None:
        try:
            return os.stat(blob.path).st_size, None
        except FileNotFoundError:
            raise FileNotFoundError(f"{blob.path} does not exist.") from None
    info = blob.retried(lambda: fs.info(fs_path))
    blob.fetched.requests += 1
    FETCHES.add(requests=1)
    return int(info["size"]), etag_of(info)


def first_range(blob: Blob, expected: Expectation, start: int, end: int) -> bytes | None:
    """The first read's first range, with ``expected`` checked: on S3 from the reply's
    own headers (one request, the read itself); elsewhere the check asks ``info`` and
    ``None`` lets the read go on as usual."""
    fs, fs_path = blob.filesystem
    if expected.checking_here():
        return None  # the check's own read: read on as usual
    if getattr(fs, "_call_s3", None) is None or end <= start:
        expected.settle(blob)
        return None
    from fsspec.asyn import sync

    hedger = blob.hedger()

    def get() -> tuple[bytes, str, Any]:
        blob.fetched.requests += 1
        FETCHES.add(requests=1)
        if hedger is None:
            return sync(fs.loop, _get_range, fs, fs_path, start, end)  # type: ignore[union-attr]
        read = lambda: _get_range(fs, fs_path, start, end)  # noqa: E731
        got: Any = sync(fs.loop, hedged, read, hedger, FETCHES)  # type: ignore[union-attr]
        if isinstance(got, BaseException):
            raise got
        return cast("tuple[bytes, str, Any]", got)

    with expected.lock:
        if not expected.pending:  # another thread's first read checked it
            return None
    data, content_range, etag = blob.retried(get)
    blob.fetched.bytes += len(data)
    FETCHES.add(bytes=len(data))
    total = content_range.rsplit("/", 1)[-1]
    # A store that answered without a Content-Range: ask.
    expected.settle(blob, (int(total), etag) if total.isdigit() else None)
    return data


def etag_of(info: Mapping[str, Any]) -> str | None:
    """The ETag in an fsspec ``info`` (``None`` where the store gives none)."""
    for key in ("ETag", "etag"):
        if info.get(key) is not None:
            return str(info[key])
    return None


async def _get_range(fs: Any, fs_path: str, start: int, end: int) -> tuple[bytes, str, Any]:
    """Bytes ``[start, end)`` of an object on S3 (s3fs's async client), with the
    reply's ``Content-Range`` and ETag."""
    bucket, key, _ = fs.split_path(fs_path)
    span = f"bytes={start}-{end - 1}"
    reply = await fs._call_s3("get_object", Bucket=bucket, Key=key, Range=span)
    try:
        data = await reply["Body"].read()
    finally:
        reply["Body"].close()
    return data, reply.get("ContentRange", ""), reply.get("ETag")
