"""meshfeed's folder layout: file names, part folders, and a prepared folder's record.

A folder holds ``meshfeed.json`` (the manifest, written last) beside its shards, or,
written by several workers, one such folder per part, ``part-0000i-of-0000n``. A folder
made by ``meshfeed.prepare`` also holds ``meshfeed.prepare.json``: the build's record
(inputs, settings, the tokenizer's identity, the parts) written before any part, and
marked complete by whichever run finishes the last part. ``check_prepared`` is what
``open_source`` asks of such a folder: complete, and made with the tokenizer the reader
names, if one is named.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from meshfeed.data._tokenizer import Tokenizer, TokenizerArg, differences
from meshfeed.storage._blob import Blob, is_url, require_fsspec

MANIFEST = "meshfeed.json"
FORMAT = "meshfeed.source/1"
RECORD = "meshfeed.prepare.json"
RECORD_FORMAT = "meshfeed.prepare/1"


def join(root: str, *parts: str) -> str:
    """``root/parts...`` for a local path or a URL."""
    return "/".join([root.rstrip("/"), *parts]) if is_url(root) else os.path.join(root, *parts)


def part_folder(index: int, count: int) -> str:
    """The folder of part ``index`` of ``count`` written separately."""
    return f"part-{index:05d}-of-{count:05d}"


def exists(path: str, storage_options: Mapping[str, Any] | None = None) -> bool:
    if not is_url(path):
        return os.path.exists(path)
    fs, inner = require_fsspec().core.url_to_fs(path, **dict(storage_options or {}))
    return bool(fs.exists(inner))


def read_json(path: str, storage_options: Mapping[str, Any] | None = None) -> Any:
    """The JSON at ``path`` (behind a URL, one request), or ``None`` where there is none."""
    try:
        return json.loads(Blob(path, storage_options).read_all())
    except FileNotFoundError:
        return None


def missing_parts(
    root: str, count: int, storage_options: Mapping[str, Any] | None = None
) -> list[int]:
    """The parts of ``count`` under ``root`` whose manifest is not written yet."""
    if not is_url(root):
        return [
            i
            for i in range(count)
            if not os.path.exists(os.path.join(root, part_folder(i, count), MANIFEST))
        ]
    fs, inner = require_fsspec().core.url_to_fs(root, **dict(storage_options or {}))
    found = set(fs.glob(f"{inner.rstrip('/')}/part-*-of-*/{MANIFEST}"))
    return [
        i
        for i in range(count)
        if f"{inner.rstrip('/')}/{part_folder(i, count)}/{MANIFEST}" not in found
    ]


def check_prepared(
    root: str,
    *,
    tokenizer: TokenizerArg | None = None,
    storage_options: Mapping[str, Any] | None = None,
    record: dict[str, Any] | None = None,
) -> None:
    """Refuses an unfinished build, or one made with another tokenizer than ``tokenizer``
    (``record``: the build's record, read already; else it is read now)."""
    record = record or read_json(join(root, RECORD), storage_options)
    if record is None:
        if tokenizer is not None:
            raise ValueError(
                f"tokenizer= checks the tokenizer a folder was prepared with, but {root} was "
                f"not made by meshfeed.prepare (it has no {RECORD}); drop tokenizer=."
            )
        return
    plan = record["plan"]
    count = len(plan["parts"])
    if record.get("complete") is None:
        missing = missing_parts(root, count, storage_options)
        raise FileNotFoundError(
            f"{root} is an unfinished meshfeed.prepare build: "
            + (
                f"parts {_ranges(missing)} of {count} are not written yet. "
                if missing
                else f"all {count} parts are written but the build was not marked complete. "
            )
            + "Run the same meshfeed prepare command again to finish it (it redoes only what "
            f"is missing); meshfeed prepare --status --out {root} says how far it is."
        )
    if tokenizer is not None:
        recorded = plan["tokenizer"]
        policy = recorded["policy"]
        current = Tokenizer(tokenizer, bos=policy["bos"], eos=policy["eos"]).record()
        differ = differences(recorded, current)
        if differ:
            raise ValueError(
                f"{root} was prepared with another tokenizer than the one given: "
                + "; ".join(differ)
                + ". Prepare the text again with this tokenizer, or open the folder with "
                "the one it was made with."
            )


def _ranges(ids: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2, 5`` (a long list of missing parts, readable)."""
    spans: list[list[int]] = []
    for i in ids:
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
