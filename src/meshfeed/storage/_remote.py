"""Byte ranges behind a URL: requested together, failures named, passing faults outlived.

``fetch_ranges`` asks fsspec's ``cat_ranges`` for every range of a read at once (an
async filesystem such as s3fs, gcsfs or http has them in flight together), after
merging ranges less than ``MAX_GAP`` apart into one request (the bytes between them are
read and dropped: cheaper than another round trip to a store). fsspec puts a
failed range's exception in the result list instead of raising, so each result is
checked: a missing object, denied access or a bad request is raised at once, naming the
URL; anything else (connection refused or reset, a timeout, a 5xx) is taken for a
passing fault and the failed ranges are asked again, with backoff, until ``retry_s``
has passed; then the error is raised, naming the URL and the last cause. A read that
recovers returns exactly the bytes it would have without the fault, so the stream does
not change. ``with_retries`` does the same for one call that reads through a file
object (a Parquet row group, say).
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

REMOTE_READS = 16  # reads in flight at once, per process, for files behind URLs
RETRY_S = 60.0  # how long a read outlives a failing store by default
MAX_GAP = 64 << 10  # ranges closer than this are one request
MAX_REQUEST = 16 << 20  # but no request larger than this
_PERMANENT = (PermissionError, IsADirectoryError, NotADirectoryError, ValueError, TypeError)
T = TypeVar("T")


class Backoff:
    """Waits between attempts, doubling up to 2 s, until ``retry_s`` has passed."""

    def __init__(self, url: str, retry_s: float) -> None:
        self.url, self.retry_s = url, retry_s
        self.deadline, self.delay, self.attempts = time.monotonic() + retry_s, 0.05, 0

    def wait_or_raise(self, error: BaseException) -> None:
        """Sleeps before the next attempt, or raises once the time is up."""
        if time.monotonic() + self.delay > self.deadline:
            raise OSError(
                f"reading {self.url} failed for {self.retry_s:g} s ({self.attempts} attempts); "
                f"the last error: {type(error).__name__}: {error}. The store is unreachable "
                "or failing."
            ) from error
        time.sleep(self.delay)
        self.delay = min(2 * self.delay, 2.0)


def with_retries(call: Callable[[], T], url: str, *, retry_s: float) -> T:
    """``call()``, asked again after a passing fault, for up to ``retry_s``."""
    backoff = Backoff(url, retry_s)
    while True:
        backoff.attempts += 1
        try:
            return call()
        except Exception as error:
            _raise_if_permanent(error, url, 0, -1)
            backoff.wait_or_raise(error)


def _raise_if_permanent(error: BaseException, url: str, start: int, end: int) -> None:
    if isinstance(error, FileNotFoundError):
        raise FileNotFoundError(f"{url} does not exist ({error}).") from error
    if isinstance(error, _PERMANENT):
        what = f"bytes {start}-{end} of " if end >= 0 else ""
        raise OSError(f"reading {what}{url} failed: {type(error).__name__}: {error}") from error


def merge(starts: Sequence[int], ends: Sequence[int]) -> list[tuple[int, int, list[int]]]:
    """Requests ``(start, end, ranges in it)`` covering every range, nearby ones merged."""
    requests: list[tuple[int, int, list[int]]] = []
    for i in sorted(range(len(starts)), key=lambda i: starts[i]):
        if requests:
            lo, hi, members = requests[-1]
            if starts[i] - hi <= MAX_GAP and max(hi, ends[i]) - lo <= MAX_REQUEST:
                requests[-1] = (lo, max(hi, ends[i]), [*members, i])
                continue
        requests.append((starts[i], ends[i], [i]))
    return requests


class Counter:
    """Requests and bytes fetched (a read's retries included)."""

    def __init__(self) -> None:
        self.requests = 0
        self.bytes = 0


def fetch_ranges(
    fs: Any,
    fs_path: str,
    url: str,
    starts: Sequence[int],
    ends: Sequence[int],
    *,
    retry_s: float,
    counter: Counter,
) -> list[bytes]:
    """Bytes ``[starts[i], ends[i])`` of one object, for every ``i``."""
    requests = merge(starts, ends)
    fetched = _fetch(
        fs, fs_path, url, [r[0] for r in requests], [r[1] for r in requests], retry_s, counter
    )
    out: list[bytes] = [b""] * len(starts)
    for (lo, _, members), data in zip(requests, fetched, strict=True):
        for i in members:
            out[i] = data[starts[i] - lo : ends[i] - lo]
    return out


def _fetch(
    fs: Any,
    fs_path: str,
    url: str,
    starts: Sequence[int],
    ends: Sequence[int],
    retry_s: float,
    counter: Counter,
) -> list[bytes]:
    out: list[bytes] = [b""] * len(starts)
    todo = list(range(len(starts)))
    backoff = Backoff(url, retry_s)
    while todo:
        backoff.attempts += 1
        counter.requests += len(todo)
        try:
            got = fs.cat_ranges(
                [fs_path] * len(todo), [starts[i] for i in todo], [ends[i] for i in todo]
            )
        except Exception as error:  # the call itself failed: every range failed with it
            got = [error] * len(todo)
        failed: list[tuple[int, BaseException]] = []
        for i, data in zip(todo, got, strict=True):
            if isinstance(data, BaseException):
                _raise_if_permanent(data, url, starts[i], ends[i])
                failed.append((i, data))
            else:
                out[i] = bytes(data)
                counter.bytes += len(data)
        if failed:
            backoff.wait_or_raise(failed[0][1])
        todo = [i for i, _ in failed]
    return out


_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def remote_pool() -> concurrent.futures.ThreadPoolExecutor:
    """The threads that keep reads of several files behind URLs in flight together."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(
                REMOTE_READS, thread_name_prefix="meshfeed-remote-read"
            )
        return _pool
