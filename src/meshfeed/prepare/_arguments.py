"""``prepare``'s arguments checked: the settings a build keeps on record, and how it runs.

The settings are what the output depends on (the field, the kept fields, how ``.txt``
files split, bad records, the part size; for conversations, the fields a record's tools
and documents come from); they are written in the build's record and a resumed build
must match them. How it runs (workers, threads, a share of the parts, the executor)
changes nothing in the output and is only checked.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from meshfeed.prepare._read import KEEP_TYPES


def settings_of(
    text: str,
    keep: Sequence[str] | Mapping[str, str],
    txt: str,
    on_error: str,
    part_bytes: int | None,
    *,
    chat: bool = False,
    chat_fields: Mapping[str, str | None] = {},
    chat_openai: bool = False,
) -> dict[str, Any]:
    """The build's settings on record, each checked; ``chat_fields``: the record's fields
    that ``apply_chat_template`` takes beside the messages (``tools``, ``documents``)."""
    if not isinstance(text, str) or not text:
        what = "chat" if chat else "text"
        raise ValueError(f"{what}={text!r} must name the field that holds the {what}.")
    if isinstance(keep, str):
        raise TypeError(f"keep={keep!r} is a string; pass a list of field names, e.g. keep=['id'].")
    kept = dict(keep) if isinstance(keep, Mapping) else {str(k): "str" for k in keep}
    bad = {k: v for k, v in kept.items() if v not in KEEP_TYPES}
    if bad:
        raise ValueError(f"keep={kept}: each field's type must be one of {list(KEEP_TYPES)}.")
    reserved = [k for k in kept if k in ("tokens", text, *(("loss_mask",) if chat else ()))]
    if reserved:
        raise ValueError(f"keep={list(kept)} names {reserved}, which prepare writes itself.")
    if txt not in ("file", "line"):
        raise ValueError(f"txt={txt!r} must be 'file' (a document per file) or 'line'.")
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error={on_error!r} must be 'raise' or 'skip'.")
    if part_bytes is not None and (
        not isinstance(part_bytes, int) or isinstance(part_bytes, bool) or part_bytes < 1
    ):
        raise ValueError(f"part_bytes={part_bytes!r} must be an int >= 1 (bytes of input).")
    settings = {
        "text": text,
        "keep": kept,
        "txt": txt,
        "on_error": on_error,
        "part_bytes": part_bytes,
    }
    if chat:  # (not written otherwise: a text build's record stays as it was)
        settings["chat"] = True
        fields = {k: v for k, v in chat_fields.items() if v is not None}
        named = [v for v in fields.values() if not isinstance(v, str) or not v]
        if named:
            raise ValueError(f"chat_tools and chat_documents must name fields, not {named}.")
        settings["chat_fields"] = fields  # kwarg -> field
        if not isinstance(chat_openai, bool):
            raise TypeError(f"chat_openai={chat_openai!r} must be True or False.")
        if chat_openai:  # (only when set: earlier builds' records stay as they were)
            settings["chat_openai"] = True
    elif any(v is not None for v in chat_fields.values()) or chat_openai:
        raise ValueError(
            "chat_tools=, chat_documents= and chat_openai= are for conversations; pass chat= too."
        )
    return settings


def check_run(
    workers: int | None, threads: int | None, part: tuple[int, int] | None, executor: str
) -> int:
    if executor not in ("local", "ray"):
        raise ValueError(f"executor={executor!r} must be 'local' or 'ray'.")
    if workers is not None and (
        not isinstance(workers, int) or isinstance(workers, bool) or workers < 1
    ):
        raise ValueError(f"workers={workers!r} must be an int >= 1 (local processes).")
    if threads is not None and (
        not isinstance(threads, int) or isinstance(threads, bool) or threads < 1
    ):
        raise ValueError(f"threads={threads!r} must be an int >= 1 (tokenizer threads a worker).")
    if part is not None and not (
        isinstance(part, tuple)
        and len(part) == 2
        and all(isinstance(x, int) for x in part)
        and 0 <= part[0] < part[1]
    ):
        raise ValueError(f"part={part!r} must be (i, n) with 0 <= i < n, e.g. part=(0, 4).")
    return workers or os.cpu_count() or 1
