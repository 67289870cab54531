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
not change.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

RETRY_S = 60.0  # how long a read outlives a failing store by default
MAX_GAP = 64 << 10  # ranges closer than this are one request
MAX_REQUEST = 16 << 20  # but no request larger than this
_PERMANENT = (PermissionError, IsADirectoryError, NotADirectoryError, ValueError, TypeError)


def _raise_if_permanent(error: BaseException, url: str, start: int, end: int) -> None:
    if isinstance(error, FileNotFoundError):
        raise FileNotFoundError(f"{url} does not exist ({error}).") from error
    if isinstance(error, _PERMANENT):
        raise OSError(
            f"reading bytes {start}-{end} of {url} failed: {type(error).__name__}: {error}"
        ) from error


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
    deadline, delay, attempts = time.monotonic() + retry_s, 0.05, 0
    while todo:
        attempts += 1
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
        if failed and time.monotonic() + delay > deadline:
            error = failed[0][1]
            raise OSError(
                f"reading {url} failed for {retry_s:g} s ({attempts} attempts); the last "
                f"error: {type(error).__name__}: {error}. The store is unreachable or failing."
            ) from error
        if failed:
            time.sleep(delay)
            delay = min(2 * delay, 2.0)
        todo = [i for i, _ in failed]
    return out
