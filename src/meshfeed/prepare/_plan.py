"""``prepare``'s plan: the inputs listed and cut into parts, on record before any part.

The plan -- the inputs (each with its size), the settings, the tokenizer's identity, the
parts -- is written to ``out/meshfeed.prepare.json`` before any part is. A later run
(after a crash, or another ``--part i/N`` share on another machine) plans again from
its own arguments and must find the same plan there, or it is refused, naming what
differs. The part size is the one setting a re-run may leave out: it goes on with the
parts the build started with.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from meshfeed.data._folder import MANIFEST, RECORD, RECORD_FORMAT, join, read_json
from meshfeed.data._tokenizer import Tokenizer, differences
from meshfeed.data._writer import FolderWriter
from meshfeed.prepare._chat import ChatTokenizer
from meshfeed.prepare._inputs import dataset_input, default_part_bytes, expand, plan_parts
from meshfeed.storage._blob import is_url


def plan_build(
    inputs: Any,
    root: str,
    tok: Tokenizer | ChatTokenizer,
    settings: dict[str, Any],
    storage_options: Mapping[str, Any] | None,
) -> tuple[dict[str, Any], Any]:
    """The build's plan, on record in ``root`` (written there, or checked against the
    record of the build started there), and the dataset that ``inputs`` is, if one."""
    dataset = None
    if type(inputs).__module__.split(".")[0] == "datasets":
        dataset = inputs
        files = [dataset_input(inputs)]
    else:
        files = expand(inputs, storage_options)
    if settings["keep"] and any(f["kind"] == "txt" for f in files):
        raise ValueError("keep= names fields of records, but .txt inputs have none; drop keep=.")
    record = read_json(join(root, RECORD), storage_options)  # a build started before
    if settings["part_bytes"] is None:  # goes on with the parts it started with
        settings["part_bytes"] = (
            record["plan"]["settings"]["part_bytes"]
            if record is not None
            else default_part_bytes(files)
        )
    parts = plan_parts(
        files,
        part_bytes=settings["part_bytes"],
        txt=settings["txt"],
        storage_options=storage_options,
    )
    if len(parts) > 99_999:  # part folders are numbered with five digits
        raise ValueError(
            f"part_bytes={settings['part_bytes']} cuts the inputs into {len(parts):,} parts, "
            "more than a folder holds (99,999); pass a larger part_bytes."
        )
    plan = {"inputs": files, "settings": settings, "tokenizer": tok.record(), "parts": parts}
    _start_record(root, plan, record, storage_options)
    return plan, dataset


def _start_record(
    root: str,
    plan: dict[str, Any],
    record: dict[str, Any] | None,
    storage_options: Mapping[str, Any] | None,
) -> None:
    """Writes the build's record, or checks that the one there (``record``, read once by
    the caller) plans this same build."""
    if read_json(join(root, MANIFEST), storage_options) is not None:
        raise FileExistsError(
            f"{join(root, MANIFEST)} exists: {root} holds a dataset written by write_source; "
            "prepare into a new folder."
        )
    if record is None:
        write_record(
            root, {"format": RECORD_FORMAT, "plan": plan, "complete": None}, storage_options
        )
        return
    old = record["plan"]
    differ = []
    if old["tokenizer"] != plan["tokenizer"]:
        differ += [f"tokenizer {d}" for d in differences(old["tokenizer"], plan["tokenizer"])]
    for key, value in plan["settings"].items():
        if old["settings"].get(key) != value:
            differ.append(f"{key}={value!r} now, {old['settings'].get(key)!r} when it started")
    before = {f["path"]: f for f in old["inputs"]}
    now = {f["path"]: f for f in plan["inputs"]}
    if list(before) != list(now):
        differ.append(
            f"the inputs are {list(now)[:4]}... now, {list(before)[:4]}... when it started"
        )
    else:
        for path, f in now.items():
            if f != before[path]:
                differ.append(
                    f"input {path} is {f['size']} bytes now, {before[path]['size']} when it started"
                )
    if not differ and old["parts"] != plan["parts"]:
        differ.append("the parts are cut differently")
    if differ:
        raise ValueError(
            f"{root} holds a build of other inputs or settings than this one: "
            + "; ".join(differ[:4])
            + ". Finish it with the same command, or prepare into a new folder."
        )


def write_record(
    root: str, record: dict[str, Any], storage_options: Mapping[str, Any] | None
) -> None:
    """Writes ``record`` as the build's record in ``root``, over the one there."""
    if not is_url(root):
        os.makedirs(root, exist_ok=True)
    FolderWriter(root, storage_options).write(RECORD, json.dumps(record, indent=1).encode())
