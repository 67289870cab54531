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
from meshfeed.storage._file_errors import named

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
        data = Blob(path, storage_options).read_all()
    except FileNotFoundError:
        return None
    with named(path):  # cut short or corrupt: named
        return json.loads(data)


_TFRECORDS = (".tfrecord", ".tfrecords", ".tfrec", ".tfrecord.gz")
_IMAGES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
_READERS = (
    # (suffixes, what a file is, the source that reads it, whether it needs an index)
    ((".parquet",), "Parquet", "meshfeed.sources.ParquetSource", False),
    ((".tar", ".tgz", ".tar.gz", ".tar.zst"), "WebDataset tar", "meshfeed.sources.TarSource", True),
    ((".jsonl", ".jsonl.gz", ".jsonl.zst"), "JSON Lines", "meshfeed.sources.JsonlSource", True),
    (_TFRECORDS, "TFRecord", "meshfeed.sources.TFRecordSource", True),
    ((".array_record",), "ArrayRecord", "meshfeed.sources.ArrayRecordSource", False),
    (_IMAGES, "image", "meshfeed.ImageFolderSource", False),
    ((".json",), "JSON", "meshfeed.sources.JsonlSource", True),
)


def _reader_of(name: str) -> tuple[str, str, str, bool] | None:
    """``(suffix, what, source, indexed)`` for a file name meshfeed reads with a source
    of its own (not ``open_source``), by its suffix (the longest that fits)."""
    name = name.lower()
    if ".array_record" in name:  # also Grain's "x.array_record-00000-of-00008"
        return (".array_record", "ArrayRecord", "meshfeed.sources.ArrayRecordSource", False)
    fits = [(s, r) for r in _READERS for s in r[0] if name.endswith(s)]
    if not fits:
        return None
    suffix, (_, what, source, indexed) = max(fits, key=lambda f: len(f[0]))
    return suffix, what, source, indexed


def _call(source: str, pattern: str) -> str:
    if source.endswith("ImageFolderSource"):
        return f"{source}(files={pattern!r})"
    return f"{source}({pattern!r})"


def _hint(what: str, source: str, path: str, indexed: bool, glob: bool) -> str:
    """What opens ``path`` (a file, or a glob of files), and the index it needs first."""
    it, holds, rename = ("them", "hold", "") if glob else ("it", "holds", "")
    if what == "JSON":  # JSON Lines named .json: JsonlSource takes them named .jsonl
        path = path[: -len(".json")] + ".jsonl"
        rename = f"if {'they' if glob else 'it'} {holds} JSON Lines (an object per line), "
        rename += f"name {it} .jsonl and "
    shown = f"'{path}'" if glob else path
    then = f" (indexed once first: meshfeed index {shown})" if indexed else ""
    return f"{rename}open {it} with {_call(source, path)}{then}."


def _a(what: str) -> str:
    return f"{'an' if what[0] in 'AEIOUaeiou' else 'a'} {what}"


def not_a_folder(root: str, names: list[str] | None = None) -> str | None:
    """Why ``root`` is no meshfeed folder, naming the source that reads it: a file by its
    suffix, or (``names``: the folder's file names) a folder of such files, by the most
    common kind, as a glob; ``None`` where nothing says."""
    if names is None:
        found = _reader_of(root.rstrip("/").rsplit("/", 1)[-1])
        if found is None:
            return None
        _, what, source, indexed = found
        return (
            f"{root} is {_a(what)} file, not a meshfeed folder (open_source opens a folder "
            f"with {MANIFEST}, a .npy or a .npz): {_hint(what, source, root, indexed, False)}"
        )
    kinds: dict[tuple[str, str, str, bool], int] = {}
    for name in names:
        found = _reader_of(name)
        if found is not None and not name.startswith("meshfeed.") and "meshfeed-index" not in name:
            kinds[found] = kinds.get(found, 0) + 1
    if not kinds:
        return None
    (suffix, what, source, indexed), count = max(kinds.items(), key=lambda k: k[1])
    pattern = join(root, "*" + (".array_record*" if what == "ArrayRecord" else suffix))
    return (
        f"{root} has no {MANIFEST}, so it is not a meshfeed folder, but it holds {count} "
        f"{what} files: {_hint(what, source, pattern, indexed, True)}"
    )


def listing(root: str, storage_options: Mapping[str, Any] | None) -> list[str] | None:
    """The names in folder ``root``, or ``None`` where it is no folder."""
    if not is_url(root):
        return os.listdir(root) if os.path.isdir(root) else None
    fs, inner = require_fsspec().core.url_to_fs(root, **dict(storage_options or {}))
    if not fs.isdir(inner):
        return None
    return [p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(inner, detail=False)]


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
    command = plan.get("command", "meshfeed prepare")  # or meshfeed shard: images
    if record.get("complete") is None:
        missing = missing_parts(root, count, storage_options)
        status = (
            f"; meshfeed prepare --status --out {root} says how far it is"
            if command == "meshfeed prepare"
            else ""
        )
        raise FileNotFoundError(
            f"{root} is an unfinished {command} build: "
            + (
                f"parts {_ranges(missing)} of {count} are not written yet. "
                if missing
                else f"all {count} parts are written but the build was not marked complete. "
            )
            + f"Run the same {command} command again to finish it (it redoes only what "
            f"is missing){status}."
        )
    if tokenizer is not None and "tokenizer" not in plan:
        raise ValueError(
            f"tokenizer= checks the tokenizer a folder was prepared with, but {root} was "
            f"written by {command}, with no tokenizer; drop tokenizer=."
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
