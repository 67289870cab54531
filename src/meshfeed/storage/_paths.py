"""Files named by the user: paths, globs, brace patterns and URLs, in a fixed order.

``expand_paths`` turns what a user writes -- ``data/*.jsonl``, ``shard-{000..127}.tar``,
``s3://bucket/text/*.parquet``, a list of those -- into the list of files it names, in
the order given (a glob's matches sorted, a brace pattern in its own order), so that
every process of a job, and every run of a build, sees the same files in the same order.
A name that matches nothing is refused by name.
"""

from __future__ import annotations

import collections
import glob
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from meshfeed.storage._blob import is_url, require_fsspec

_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")


def kind_by_suffix(path: str, kinds: Mapping[str, str]) -> str | None:
    """The kind ``kinds`` gives the longest suffix ``path``'s file name ends with (so
    ``.jsonl.gz`` wins over ``.gz``); ``None`` when none fits. Case is ignored."""
    name = path.rsplit("/", 1)[-1].lower()
    for suffix in sorted(kinds, key=len, reverse=True):
        if name.endswith(suffix):
            return kinds[suffix]
    return None


def expand_braces(pattern: str) -> list[str]:
    """``a-{000..002}.tar`` -> ``a-000.tar, a-001.tar, a-002.tar`` (zero padding kept);
    ``{x,y}`` -> ``x``, ``y``; several braces multiply out, left to right."""
    match = _BRACE.search(pattern)
    if match is None:
        return [pattern]
    inner = match.group(1)
    span = _RANGE.match(inner)
    if span:
        lo, hi = int(span.group(1)), int(span.group(2))
        width = len(span.group(1)) if span.group(1).startswith("0") else 0
        step = 1 if hi >= lo else -1
        choices = [str(i).zfill(width) for i in range(lo, hi + step, step)]
    else:
        choices = inner.split(",")
    head, tail = pattern[: match.start()], pattern[match.end() :]
    return [p for choice in choices for p in expand_braces(head + choice + tail)]


def expand_paths(
    names: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    storage_options: Mapping[str, Any] | None = None,
    *,
    what: str = "inputs",
) -> list[str]:
    """The files ``names`` name, in order (the module docstring)."""
    given = [os.fspath(names)] if isinstance(names, str | os.PathLike) else list(names)
    if not given:
        raise ValueError(f"{what} is empty; pass paths, globs or URLs.")
    out: list[str] = []
    for name in given:
        if not isinstance(name, str | os.PathLike):
            raise TypeError(f"{what} holds a {type(name).__name__}; pass paths, globs or URLs.")
        for pattern in expand_braces(os.fspath(name)):
            out += _matches(pattern, storage_options)
    twice = sorted(p for p, n in collections.Counter(out).items() if n > 1)
    if twice:
        raise ValueError(f"{what} names {twice} more than once; name each file once.")
    return out


def _matches(name: str, storage_options: Mapping[str, Any] | None) -> list[str]:
    pattern = any(c in name for c in "*?[")
    if not is_url(name):
        if not pattern:
            if not os.path.isfile(name):
                raise FileNotFoundError(f"{name} does not exist (or is not a file).")
            return [name]
        found = sorted(p for p in glob.glob(name, recursive=True) if os.path.isfile(p))
    else:
        fs, inner = require_fsspec().core.url_to_fs(name, **dict(storage_options or {}))
        protocol = name.split("://", 1)[0]
        if not pattern:
            if not fs.isfile(inner):
                raise FileNotFoundError(f"{name} does not exist (or is not a file).")
            return [name]
        found = sorted(
            f"{protocol}://{p.lstrip('/')}" if protocol != "file" else p
            for p in fs.glob(inner)
            if fs.isfile(p)
        )
    if not found:
        raise FileNotFoundError(f"{name} matches no file.")
    return found
