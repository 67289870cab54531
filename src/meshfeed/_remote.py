"""Byte ranges behind a URL: requested together, failures named, passing faults outlived.

``fetch_ranges`` asks fsspec's ``cat_ranges`` for every range of a read at once (an
async filesystem such as s3fs, gcsfs or http has them in flight together). fsspec puts a
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
_PERMANENT = (PermissionError, IsADirectoryError, NotADirectoryError, ValueError, TypeError)


def _raise_if_permanent(error: BaseException, url: str, start: int, end: int) -> None:
    if isinstance(error, FileNotFoundError):
        raise FileNotFoundError(f"{url} does not exist ({error}).") from error
    if isinstance(error, _PERMANENT):
        raise OSError(
            f"reading bytes {start}-{end} of {url} failed: {type(error).__name__}: {error}"
        ) from error


def fetch_ranges(
    fs: Any, fs_path: str, url: str, starts: Sequence[int], ends: Sequence[int], *, retry_s: float
) -> list[bytes]:
    """Bytes ``[starts[i], ends[i])`` of one object, for every ``i``."""
    out: list[bytes] = [b""] * len(starts)
    todo = list(range(len(starts)))
    deadline, delay, attempts = time.monotonic() + retry_s, 0.05, 0
    while todo:
        attempts += 1
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
