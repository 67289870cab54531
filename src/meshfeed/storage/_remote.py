"""Byte ranges behind a URL: requested together, failures named, passing faults outlived.

``fetch_ranges`` asks fsspec's ``cat_ranges`` for every range of a read at once (an
async filesystem such as s3fs, gcsfs or http has them in flight together), after
merging ranges less than ``MAX_GAP`` apart into one request (the bytes between them are
read and dropped: cheaper than another round trip to a store). fsspec puts a
failed range's exception in the result list instead of raising, so each result is
checked: a missing object, denied access or a bad request is raised at once, naming the
URL; anything else (connection refused or reset, a timeout, a 5xx) is taken for a
passing fault and the failed ranges are asked again on the store's clock (``_clock``):
one clock per store and process, shared by every read, that gives up once the store
has failed for ``retry_s`` with no success. A read that recovers returns exactly the
bytes it would have without the fault, so the stream does not change. ``with_retries``
does the same for one call that reads through a file object (a Parquet row group, say).

A store is named by its filesystem's protocol and endpoint (``endpoint_url``, in the
storage options or their ``client_kwargs``), or, with no endpoint given, by the
protocol and the bucket (the URL's first part: ``s3://bucket``): ``store_name``.

The clock counts whole attempts, so the client library must not stretch one attempt
with retries of its own: s3fs tries a call 5 times and botocore retries inside each,
which made one attempt on a store that refuses connections last 8.2 s (0.0 s without).
``reader_options`` switches botocore's off (``total_max_attempts=1``) and bounds a
connection's wait (``connect_timeout`` 5 s, ``read_timeout`` 20 s) unless the storage
options set them, and ``bound_inner_retries`` sets s3fs's (a class attribute, not an
option) to one try on the filesystem the reads go through. Other filesystems keep
their own retries, inside the clock.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

from meshfeed.core._tally import Tally
from meshfeed.core._waits import WAITS
from meshfeed.storage._clock import StoreClock, clock_for
from meshfeed.storage._hedge import Hedger, hedged_ranges

# Reads in flight at once, per process, for files behind URLs (each waits on a thread of
# the remote pool, and on S3 on one of botocore's connections, 10 unless set): a store
# that answers in 0.5 s kept a loop of 0.1 s steps waiting 87% of its time with 16
# (whatever the read-ahead's depth), 26% with 64 (benchmarks/hedge.py, Q-floor).
REMOTE_READS = 64
RETRY_S = 60.0  # how long a store may fail with no success, by default
MAX_GAP = 64 << 10  # ranges closer than this are one request
MAX_REQUEST = 16 << 20  # but no request larger than this
CONNECT_TIMEOUT_S = 5  # botocore's wait for a connection (s3 URLs)
READ_TIMEOUT_S = 20  # and for the next bytes of an answer
_S3 = ("s3", "s3a")
_PERMANENT = (PermissionError, IsADirectoryError, NotADirectoryError, ValueError, TypeError)
T = TypeVar("T")
FETCHES = Tally(
    "requests", "retries", "hedges", "hedges_won", "bytes", "cache_hits", "cache_downloads"
)
"""This process's reads behind URLs: ranged requests (retries among them, duplicates
not), duplicates sent for slow reads and those that answered first, bytes fetched,
reads served by the cache's local copies, objects the cache downloaded."""


def reader_options(url: str, storage_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``storage_options`` with the client library's own retries off where meshfeed
    knows how (s3: botocore's ``config_kwargs``) and as many connections as reads in
    flight (``REMOTE_READS``), the user's settings kept."""
    options = dict(storage_options or {})
    if url.split("://", 1)[0] in _S3:
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("retries", {"total_max_attempts": 1})
        config.setdefault("connect_timeout", CONNECT_TIMEOUT_S)
        config.setdefault("read_timeout", READ_TIMEOUT_S)
        config.setdefault("max_pool_connections", REMOTE_READS)
        options["config_kwargs"] = config
    return options


def bound_inner_retries(fs: Any) -> None:
    """One try per call in s3fs (its ``retries``, 5 by default, is not an option)."""
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if protocol in _S3:
        fs.retries = 1


def store_name(fs: Any, fs_path: str) -> str:
    """What names the store behind ``fs_path``: its protocol and endpoint, or bucket."""
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    options = getattr(fs, "storage_options", None) or {}
    endpoint = options.get("endpoint_url") or (options.get("client_kwargs") or {}).get(
        "endpoint_url"
    )
    if endpoint:
        return f"the {protocol} store at {endpoint}"
    if "://" in fs_path:  # http(s): the host
        return f"the store at {urlsplit(fs_path).netloc}"
    return f"the store {protocol}://{fs_path.lstrip('/').split('/', 1)[0]}"


def with_retries(call: Callable[[], T], url: str, *, retry_s: float, clock: StoreClock) -> T:
    """``call()``, asked again after a passing fault until ``clock`` says ``retry_s``."""
    with WAITS.waiting("reading", url):
        while True:
            with clock.attempt(url, retry_s) as attempt:
                try:
                    result = call()
                except Exception as error:
                    _raise_if_permanent(error, url, 0, -1)
                    attempt.failed(error)
                    continue
                attempt.succeeded()
                return result


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
    first: Callable[[int, int], bytes | None] | None = None,
    hedger: Hedger | None = None,
) -> list[bytes]:
    """Bytes ``[starts[i], ends[i])`` of one object, for every ``i`` (``first``: asked for
    the first request's range before the others; ``None`` from it leaves it to them;
    ``hedger``: the store's, to give a slow request a duplicate; ``None``: never)."""
    with WAITS.waiting("reading", url):
        requests = merge(starts, ends)
        clock = clock_for(store_name(fs, fs_path))
        ask = _hedged(fs, fs_path, hedger) if hedger is not None else None
        lows, highs = [r[0] for r in requests], [r[1] for r in requests]
        head = first(lows[0], highs[0]) if first is not None and requests else None
        if head is None:
            fetched = _fetch(fs, fs_path, url, lows, highs, retry_s, clock, counter, ask)
        else:
            rest = _fetch(fs, fs_path, url, lows[1:], highs[1:], retry_s, clock, counter, ask)
            fetched = [head, *rest]
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
    clock: StoreClock,
    counter: Counter,
    ask: Callable[[list[int], list[int]], list[Any]] | None,
) -> list[bytes]:
    out: list[bytes] = [b""] * len(starts)
    todo = list(range(len(starts)))
    again = 0  # requests asked again after a passing fault
    while todo:
        with clock.attempt(url, retry_s) as attempt:
            counter.requests += len(todo)
            FETCHES.add(requests=len(todo), retries=again)
            try:
                lows, highs = [starts[i] for i in todo], [ends[i] for i in todo]
                got = ask(lows, highs) if ask else fs.cat_ranges([fs_path] * len(todo), lows, highs)
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
            FETCHES.add(bytes=sum(len(out[i]) for i in todo))
            if len(failed) < len(todo):
                attempt.succeeded()
            if failed:
                attempt.failed(failed[0][1])
        todo = [i for i, _ in failed]
        again = len(todo)
    return out


def _hedged(
    fs: Any, fs_path: str, hedger: Hedger
) -> Callable[[list[int], list[int]], list[Any]] | None:
    """``cat_ranges`` of ``fs_path`` with each range hedged (``None``: ``fs`` reads no
    range asynchronously, so nothing is hedged)."""
    if not (getattr(fs, "async_impl", False) and hasattr(fs, "_cat_file")):
        return None
    from fsspec.asyn import sync

    def ask(lows: list[int], highs: list[int]) -> list[Any]:
        got = sync(fs.loop, hedged_ranges, fs, fs_path, lows, highs, hedger, FETCHES)
        return cast("list[Any]", got)  # fsspec types sync() as returning None

    return ask


class _Pool(concurrent.futures.ThreadPoolExecutor):
    """Runs each call in a copy of its caller's context: a wait recorded there counts
    toward the caller's read (``core._waits.timing_waits``)."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        return super().submit(contextvars.copy_context().run, fn, *args, **kwargs)


_pool: _Pool | None = None
_pool_lock = threading.Lock()


def remote_pool() -> concurrent.futures.ThreadPoolExecutor:
    """The threads that keep reads of several files behind URLs in flight together."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = _Pool(REMOTE_READS, thread_name_prefix="meshfeed-remote-read")
        return _pool


@contextlib.contextmanager
def counting(url: str, storage_options: Mapping[str, Any] | None) -> Iterator[dict[str, int]]:
    """Counts the requests this process sends the store behind ``url`` inside the block,
    by kind: on S3 every request the client sends (``HeadObject``, ``GetObject``,
    ``ListObjectsV2``, ...: botocore's ``before-send`` event); elsewhere meshfeed's own
    (``requests``, as ``loader.stats()`` counts them)."""
    counts: dict[str, int] = collections.Counter()
    if url.split("://", 1)[0] in _S3:
        import fsspec

        fs = fsspec.core.url_to_fs(url, **reader_options(url, storage_options))[0]
        bound_inner_retries(fs)
        fs.connect()
        events = fs.s3.meta.events

        def on_send(event_name: str = "", **_: Any) -> None:
            counts[event_name.rsplit(".", 1)[-1]] += 1

        events.register("before-send.s3", on_send)
        try:
            yield counts
        finally:
            events.unregister("before-send.s3", on_send)
        return
    before = int(FETCHES.values()["requests"])
    try:
        yield counts
    finally:
        counts["requests"] = int(FETCHES.values()["requests"]) - before
