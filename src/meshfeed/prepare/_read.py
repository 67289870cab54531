"""A part's documents, read from its input: text and kept fields, with where each came from.

``documents(part, ...)`` yields batches of ``(texts, kept, counts)``: the documents'
texts in input order (with ``chat``, each conversation as JSON text), the kept fields'
values, and how many records were skipped. A bad record -- a line that is not JSON, a
missing or non-string text field (with ``chat``, not a list of messages with roles), a
kept field of the wrong type, text that is not UTF-8 -- raises ``BadInput`` naming the
file and the line (or row), unless ``on_error="skip"``, which counts it and goes on. A
truncated or unreadable compressed file always raises: what it still held cannot be told.

Files are read by byte range through ``Blob`` (``pread`` locally; behind a URL, ranged
requests with retries), a few MiB at a time, so a part's memory stays bounded whatever
the file's size. Compressed streams are decompressed as they arrive (``Inflater``: gzip
members and zstandard frames in a row, checked to end where the last one ends).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from meshfeed.prepare._inputs import InputFile, Part, open_parquet
from meshfeed.storage._blob import Blob
from meshfeed.storage._compressed import GZIP, ZSTD, Inflater

CHUNK = 8 << 20  # bytes read at a time
BATCH_BYTES = 1 << 20  # text per batch handed to the tokenizer
KEEP_TYPES = ("str", "int", "float", "bool")


class BadInput(ValueError):
    """A record or a file that cannot be read as the settings say."""


class Batch:
    """Documents read so far, handed to the tokenizer in about ``BATCH_BYTES`` of text."""

    def __init__(self, keep: Mapping[str, str]) -> None:
        self.texts: list[str] = []
        self.kept: dict[str, list[Any]] = {k: [] for k in keep}
        self.size = 0
        self.skipped = 0


def documents(
    part: Part,
    files: list[InputFile],
    settings: Mapping[str, Any],
    *,
    storage_options: Mapping[str, Any] | None = None,
    dataset: Any = None,
) -> Iterator[Batch]:
    """The part's documents in input order, in batches (the module docstring)."""
    keep: Mapping[str, str] = settings["keep"]
    reader = _Reader(settings, keep)
    f = files[part["input"]]
    a, b = part["range"]
    if part["unit"] == "files":
        for i in range(a, b):
            path = files[i]["path"]
            data = _read_all(Blob(path, storage_options))
            reader.text(path, "the file", data)
            yield from reader.flush(False)
    elif f["kind"] == "jsonl" or f["kind"] == "txt":
        blob = Blob(f["path"], storage_options)
        handle = reader.json_line if f["kind"] == "jsonl" else reader.text_line
        for offset, line in _lines_in_range(blob, a, b):
            handle(f["path"], offset, line, blob)
            yield from reader.flush(False)
    elif f["kind"] in ("jsonl.gz", "jsonl.zst"):
        lines = _lines(_decompressed(Blob(f["path"], storage_options), f["kind"]))
        for number, line in enumerate(lines, start=1):
            reader.json_record(f["path"], f"line {number}", line)
            yield from reader.flush(False)
    elif f["kind"] == "parquet":
        yield from _parquet(reader, f["path"], a, b, settings, storage_options)
    elif f["kind"] == "dataset":
        yield from _dataset(reader, dataset, a, b, settings)
    yield from reader.flush(True)


class _Reader:
    def __init__(self, settings: Mapping[str, Any], keep: Mapping[str, str]) -> None:
        self.field = settings["text"]
        self.keep = keep
        self.skip = settings["on_error"] == "skip"
        self.chat = bool(settings.get("chat"))  # the field holds a conversation, not text
        self.extras: dict[str, str] = dict(settings.get("chat_fields", {}))  # tools=, documents=
        self.openai = bool(settings.get("chat_openai"))  # messages as OpenAI writes them
        self.batch = Batch(keep)

    def flush(self, last: bool) -> Iterator[Batch]:
        if self.batch.size >= BATCH_BYTES or (last and (self.batch.texts or self.batch.skipped)):
            batch, self.batch = self.batch, Batch(self.keep)
            yield batch

    def bad(self, message: str) -> None:
        if not self.skip:
            raise BadInput(
                f"{message}; fix the input, or pass on_error='skip' to skip such records."
            )
        self.batch.skipped += 1

    def json_line(self, path: str, offset: int, line: bytes, blob: Blob) -> None:
        if line.strip():
            self.json_record(path, lambda: _line_number(blob, offset), line)

    def json_record(self, path: str, where: Any, line: bytes) -> None:
        if not line.strip():
            return
        try:
            record = json.loads(line)
        except ValueError as error:
            self.bad(f"{path}, {_where(where)}: not JSON ({error})")
            return
        if not isinstance(record, dict):
            self.bad(f"{path}, {_where(where)}: a JSON {type(record).__name__}, not an object")
            return
        self.record(path, where, record)

    def record(self, path: str, where: Any, record: Mapping[str, Any]) -> None:
        text = record.get(self.field)
        if self.chat:
            extras = {}
            for kwarg, name in self.extras.items():
                value = record.get(name)
                if value is None:
                    continue  # this record has none
                if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
                    self.bad(
                        f"{path}, {_where(where)}: field {name!r} holds {repr(value)[:60]}, not "
                        f"a list of {kwarg} (each a mapping, as apply_chat_template takes them)"
                    )
                    return
                extras[kwarg] = value
            if self.openai and isinstance(text, list):
                text = [_from_openai(m) for m in text]
            text = _conversation(text, extras)
            if text is None:
                what = repr(record.get(self.field))[:60] if self.field in record else "nothing"
                self.bad(
                    f"{path}, {_where(where)}: field {self.field!r} holds {what}, not a "
                    "conversation (a list of messages, each a mapping with a 'role')"
                )
                return
        elif not isinstance(text, str):
            what = "no field" if self.field not in record else f"a {type(text).__name__} in field"
            self.bad(f"{path}, {_where(where)}: {what} {self.field!r}, not a string of text")
            return
        values = []
        for name, kind in self.keep.items():
            value = record.get(name)
            converted = _kept(value, kind)
            if converted is None:
                self.bad(
                    f"{path}, {_where(where)}: kept field {name!r} is "
                    f"{'missing' if name not in record else repr(value)[:40]}, not a {kind}"
                )
                return
            values.append(converted)
        self.add(text, values)

    def add(self, text: str, values: list[Any]) -> None:
        self.batch.texts.append(text)
        for name, value in zip(self.keep, values, strict=True):
            self.batch.kept[name].append(value)
        self.batch.size += len(text)

    def text(self, path: str, where: str, data: bytes) -> None:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            self.bad(f"{path}, {where}: not UTF-8 ({error})")
            return
        self.add(text, [])  # plain text has no fields to keep (prepare refuses keep=)

    def text_line(self, path: str, offset: int, line: bytes, blob: Blob) -> None:
        self.text(path, f"line at byte {offset}", line.rstrip(b"\r\n"))


def _conversation(value: Any, extras: Mapping[str, Any]) -> str | None:
    """A conversation as JSON text (what the chat encoder reads: its messages, or with
    ``extras`` -- its tools, its documents -- ``{"messages": ..., **extras}``), or
    ``None`` where ``value`` is not a list of messages each with a string ``role``."""
    if not isinstance(value, list) or not value:
        return None
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in value):
        return None
    try:
        return json.dumps({"messages": value, **extras} if extras else value, ensure_ascii=False)
    except (TypeError, ValueError):
        return None


def _from_openai(message: Any) -> Any:
    """A message as OpenAI's format writes it, as chat templates read it: each tool call's
    ``function.arguments`` JSON string parsed, a ``content`` list of text parts joined
    (a list with other parts -- images -- is left as given)."""
    if not isinstance(message, dict):
        return message
    message = dict(message)
    content = message.get("content")
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        message["content"] = "".join(p["text"] for p in content)
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        message["tool_calls"] = [_parsed_call(c) for c in calls]
    return message


def _parsed_call(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    arguments = function.get("arguments") if isinstance(function, dict) else None
    if not isinstance(arguments, str):
        return call
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return call  # not JSON: left as given, for the template to show
    return {**call, "function": {**function, "arguments": parsed}}  # type: ignore[dict-item]


def _where(where: Any) -> str:
    """Where a record is: a string, or a function that says it (counted only on error)."""
    return str(where() if callable(where) else where)


def _kept(value: Any, kind: str) -> Any:
    """A kept field's value as stored, or ``None`` where it is not of its ``kind``."""
    if kind == "str":
        if isinstance(value, str):
            return value.encode()
        if isinstance(value, int | float | bool):
            return json.dumps(value).encode()
        return None
    if kind == "bool":
        return value if isinstance(value, bool) else None
    if kind == "int":
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if kind == "float":
        return (
            float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
        )
    return None


def _read_all(blob: Blob) -> bytes:
    size = blob.size()
    return b"".join(blob.read(a, min(size, a + CHUNK)) for a in range(0, size, CHUNK))


def _lines_in_range(blob: Blob, start: int, end: int) -> Iterator[tuple[int, bytes]]:
    """``(offset, line)`` of every line whose first byte is in ``[start, end)``."""
    size = blob.size()
    position = start
    carry = b""
    if start > 0:  # the line that starts before ``start`` is the previous part's
        position = start - 1
        while True:
            data = blob.read(position, min(size, position + CHUNK))
            if not data:
                return
            newline = data.find(b"\n")
            if newline >= 0:
                position += newline + 1
                break
            position += len(data)
    line_start = position
    while line_start < end and position < size:
        data = blob.read(position, min(size, position + CHUNK))
        if not data:
            break
        position += len(data)
        carry += data
        lines = carry.split(b"\n")
        carry = lines.pop()
        for line in lines:
            if line_start >= end:
                return
            yield line_start, line
            line_start += len(line) + 1
    if carry and line_start < end:
        yield line_start, carry


def _line_number(blob: Blob, offset: int) -> str:
    """``line N`` of the line at ``offset`` (counted only when an error names it)."""
    count = sum(blob.read(a, min(offset, a + CHUNK)).count(b"\n") for a in range(0, offset, CHUNK))
    return f"line {count + 1}"


def _chunks(blob: Blob) -> Iterator[bytes]:
    size = blob.size()
    for a in range(0, size, CHUNK):
        yield blob.read(a, min(size, a + CHUNK))


def _decompressed(blob: Blob, kind: str) -> Iterator[bytes]:
    inflater = Inflater(GZIP if kind == "jsonl.gz" else ZSTD, blob.path)
    for chunk in _chunks(blob):
        yield from inflater.feed(chunk)
    inflater.close()


def _lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    carry = b""
    for chunk in chunks:
        if not chunk:
            continue
        lines = (carry + chunk).split(b"\n")
        carry = lines.pop()
        yield from lines
    if carry:
        yield carry


def _parquet(
    reader: _Reader,
    path: str,
    a: int,
    b: int,
    settings: Mapping[str, Any],
    storage_options: Mapping[str, Any] | None,
) -> Iterator[Batch]:
    parquet = open_parquet(path, storage_options)
    field = settings["text"]
    keep = list(settings["keep"])
    names = parquet.schema_arrow.names
    extra = [c for c in settings.get("chat_fields", {}).values() if c in names]  # tools, ...
    missing = [c for c in (field, *keep) if c not in names]
    if missing:
        raise BadInput(f"{path}: no column {missing[0]!r} (its columns: {names})")
    row = sum(parquet.metadata.row_group(g).num_rows for g in range(a))
    for g in range(a, b):
        table = parquet.read_row_group(g, columns=[field, *keep, *extra])
        columns = {c: table.column(c).to_pylist() for c in (field, *keep, *extra)}
        for j in range(table.num_rows):
            reader.record(path, f"row {row + j}", {c: v[j] for c, v in columns.items()})
            yield from reader.flush(False)
        row += table.num_rows


def _dataset(
    reader: _Reader, dataset: Any, a: int, b: int, settings: Mapping[str, Any]
) -> Iterator[Batch]:
    field = settings["text"]
    keep = list(settings["keep"])
    missing = [c for c in (field, *keep) if c not in dataset.column_names]
    if missing:
        raise BadInput(
            f"the dataset has no column {missing[0]!r} (its columns: {dataset.column_names})"
        )
    columns = dataset.column_names
    extra = [c for c in settings.get("chat_fields", {}).values() if c in columns]
    step = 1024
    for start in range(a, b, step):
        rows = dataset.select_columns([field, *keep, *extra])[start : min(b, start + step)]
        for j in range(len(rows[field])):
            reader.record("the dataset", f"row {start + j}", {c: rows[c][j] for c in rows})
            yield from reader.flush(False)
