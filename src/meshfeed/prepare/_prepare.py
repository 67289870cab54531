"""``prepare``: text in, a meshfeed folder of token documents out, on any number of workers.

One call plans the build -- the inputs, the settings, the tokenizer's identity, the parts
-- and writes that plan to ``out/meshfeed.prepare.json`` before any part; a later run
(after a crash, or another ``--part i/N`` share on another machine) must plan exactly
the same build, or it is refused, naming what differs. Each run writes the parts of its
share that have no manifest yet, so a killed build re-run redoes only what was not
finished; whichever run finds every part written marks the record complete, with the
totals. ``open_source`` refuses a build until then.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from meshfeed.data._bad_records import OnError
from meshfeed.data._catalog import merge_manifests
from meshfeed.data._folder import (
    MANIFEST,
    RECORD,
    RECORD_FORMAT,
    join,
    missing_parts,
    part_folder,
    read_json,
)
from meshfeed.data._tokenizer import Special, Tokenizer, TokenizerArg, token_dtype
from meshfeed.prepare._arguments import check_run, settings_of
from meshfeed.prepare._chat import ChatTokenizer
from meshfeed.prepare._encode import worker_threads
from meshfeed.prepare._plan import plan_build, write_record
from meshfeed.prepare._run import Report, run_local, run_ray, start_workers, stop_workers

CHAT_PART_BYTES = 1 << 20
"""Input bytes per part for conversations (``prepare(chat=)``): smaller than for text,
since a template's rendering costs far more a byte, and both workers need parts."""

TxtMode = Literal["file", "line"]
"""How ``prepare`` reads ``.txt`` inputs: a document per file, or per line."""
PrepareExecutor = Literal["local", "ray"]
"""Where ``prepare`` runs its parts: local worker processes, or Ray tasks."""


@dataclasses.dataclass(frozen=True)
class PrepareStatus:
    """How far a ``prepare`` build is, and what the last run did.

    ``parts`` and ``done`` count every part of the build; ``documents`` and ``tokens``
    (written, BOS and EOS included), ``empty`` (documents that encode to nothing,
    dropped) and ``skipped`` (bad records, with ``on_error="skip"``) sum the parts
    written so far. ``ran``, ``seconds`` and ``tokens_per_s`` describe the run that
    returned this (zero for ``prepare_status``).
    """

    out: str
    parts: int
    done: int
    missing: list[int]
    complete: bool
    documents: int = 0
    tokens: int = 0
    empty: int = 0
    skipped: int = 0
    ran: int = 0
    seconds: float = 0.0
    tokens_per_s: float = 0.0

    def __str__(self) -> str:
        state = "complete" if self.complete else f"{len(self.missing)} parts to go"
        return (
            f"{self.out}: {self.done} of {self.parts} parts written ({state}); "
            f"{self.documents:,} documents, {self.tokens:,} tokens, {self.empty:,} empty "
            f"and {self.skipped:,} bad records dropped"
        )


def prepare(
    inputs: Any,
    out: str | os.PathLike[str],
    *,
    tokenizer: TokenizerArg,
    text: str = "text",
    chat: str | None = None,
    chat_template: str | None = None,
    chat_tools: str | None = "tools",
    chat_documents: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    chat_openai: bool = False,
    keep: Sequence[str] | Mapping[str, str] = (),
    txt: TxtMode = "file",
    bos: Special = True,
    eos: Special = True,
    on_error: OnError = "raise",
    workers: int | None = None,
    threads: int | None = None,
    part: tuple[int, int] | None = None,
    executor: PrepareExecutor = "local",
    part_bytes: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    progress: bool = True,
) -> PrepareStatus:
    """Tokenizes text into a meshfeed folder with a ``tokens`` field, a document per record;
    or, with ``chat``, conversations into ``tokens`` and an aligned ``loss_mask``.

    Args:
      inputs: paths, globs or URLs (any fsspec URL) of ``.jsonl``, ``.jsonl.gz``,
        ``.jsonl.zst``, ``.parquet`` and ``.txt`` files, in the order their documents
        should keep (a glob's matches sorted); or one ``datasets.Dataset``.
      out: the folder to write (local or a URL); it holds one part folder per part, and
        ``meshfeed.prepare.json``, the build's record.
      tokenizer: a ``tokenizers.Tokenizer``, the path of a ``tokenizer.json``, or a
        ``TokenizerFunction``. Documents are encoded without special tokens, never
        truncated (``pack`` handles long documents); the ids are stored in the
        narrowest unsigned dtype of the vocabulary.
      text: the field (JSON key, Parquet or dataset column) holding the text.
      chat: the field holding a conversation instead (a list of ``{"role", "content",
        ...}`` messages, tool calls included, as Hugging Face represents them): each is
        rendered by the chat template and tokenized by ``transformers`` (the ``chat``
        extra), so ``tokens`` equal ``apply_chat_template(messages, tokenize=True)``'s,
        nothing added (``bos`` and ``eos`` are not used), and ``loss_mask`` is True on
        the assistant's tokens (``assistant_masks`` for templates with ``{% generation
        %}`` blocks; derived from turn boundaries for others). ``tokenizer`` is then a
        ``transformers`` fast tokenizer or its folder.
      chat_template: the Jinja chat template; default: the tokenizer's own. Its hash is
        on record: a build resumed with another template is refused.
      chat_tools: the field holding a record's tools (OpenAI's format: ``{"type":
        "function", "function": {"name", "description", "parameters"}}``), passed to the
        template as ``apply_chat_template(..., tools=)`` does, as TRL does; a record
        without it has none. ``None``: tools are never read.
      chat_documents: the field holding a record's RAG documents (``documents=``);
        default: none.
      chat_template_kwargs: the template's keyword arguments, for every conversation
        (``{"enable_thinking": False}``), on record with the template's hash.
      chat_openai: read the messages as OpenAI's format writes them: a tool call's
        ``function.arguments`` JSON string is parsed into the mapping chat templates
        expect (as given, a template that applies ``tojson`` encodes it twice), and a
        ``content`` list of text parts becomes their texts, concatenated. Default ``False``:
        every message reaches the template as given, as ``apply_chat_template`` takes
        it.
      keep: other fields to keep beside the tokens: names (kept as text: UTF-8 bytes,
        one ``Ragged`` ``uint8`` document per record) or a mapping name -> ``"str"``,
        ``"int"``, ``"float"`` or ``"bool"``.
      txt: ``.txt`` inputs hold a document per ``"file"`` or per ``"line"``.
      bos: add a BOS id before every document: ``True`` where the tokenizer defines one
        (its post-processor's template, or a usual name), a token, an id, or ``False``.
      eos: add an EOS id after every document: ``True`` (the default; the tokenizer
        must define one), a token, an id, or ``False``.
      on_error: ``"raise"``: a bad record (not JSON, no text, a kept field of the wrong
        type) stops the build with an error naming the file and the line or row;
        ``"skip"``: skip it and count it. A truncated compressed file always raises.
      workers: local worker processes (default: one per core).
      threads: threads each worker's tokenizer may use (``tokenizers``' Rust pool; a
        Ray task asks for as many CPUs); default: the cores shared out among the
        workers, at least one each.
      part: ``(i, n)``: write only share ``i`` of ``n`` of the parts (part ``p`` when
        ``p % n == i``), for ``n`` separate runs -- a Slurm array, a Kubernetes indexed
        job -- in any order, any number of times. Whichever run finishes the last part
        marks the build complete.
      executor: ``"local"`` worker processes, or ``"ray"``: one Ray task per part on the
        cluster ``ray.init()`` connects to (the ``ray`` extra).
      part_bytes: input bytes per part (uncompressed). Default: the inputs' bytes over
        64, within 1 and 32 MiB (parts are what workers take: with few, the workers end
        far apart), or what the build in ``out`` started with; for conversations
        ``CHAT_PART_BYTES``, 1 MiB (rendering a template costs ~50x the tokenizer's
        time a byte). Parts are cut from the
        inputs and this alone, never from the number of workers, so the output is the
        same bytes however the build is run.
      storage_options: for URLs, the filesystem's options (``endpoint_url``, ...).
      progress: show progress: a bar on a terminal, a line per part off one.

    Returns:
      A ``PrepareStatus``: the build's state and what this run did.

    Example:
      >>> meshfeed.prepare("corpus/*.jsonl.zst", "tokens", tokenizer="tokenizer.json",
      ...                  workers=8)  # doctest: +SKIP
    """
    root = os.fspath(out)
    settings = _settings(
        text,
        keep,
        txt,
        on_error,
        part_bytes,
        chat=chat,
        chat_template=chat_template,
        chat_tools=chat_tools,
        chat_documents=chat_documents,
        chat_template_kwargs=chat_template_kwargs,
        chat_openai=chat_openai,
    )
    run_workers = check_run(workers, threads, part, executor)
    tok: Tokenizer | ChatTokenizer | None = None
    if chat is None:
        tok = Tokenizer(tokenizer, bos=bos, eos=eos)
    # Start the workers now, to boot while the build is planned (and, for conversations,
    # while this process loads the tokenizer through transformers: seconds, and the
    # workers leave it a core; a tokenizer given loaded leaves them every core).
    kind = _worker_kind(chat, tokenizer)
    pool = start_workers(run_workers, kind) if executor == "local" else []
    try:
        if tok is None:
            tok = ChatTokenizer(tokenizer, chat_template, chat_template_kwargs)
        settings["dtype"] = token_dtype(tok.vocab_size).str
        tok_threads = threads or worker_threads(run_workers)
        plan, dataset = plan_build(inputs, root, tok, settings, storage_options)
        todo = _share_to_write(root, plan, part, storage_options)
        init = _worker_init(root, plan, tok, tok_threads, dataset, storage_options)
        seconds, tokens = _write_parts(todo, init, pool, executor, tok_threads, progress)
        status = _finish(root, plan, storage_options)
        return dataclasses.replace(
            status, ran=len(todo), seconds=seconds, tokens_per_s=tokens / seconds if todo else 0.0
        )
    finally:
        stop_workers(pool)


def _settings(
    text: str,
    keep: Sequence[str] | Mapping[str, str],
    txt: str,
    on_error: str,
    part_bytes: int | None,
    *,
    chat: str | None,
    chat_template: str | None,
    chat_tools: str | None,
    chat_documents: str | None,
    chat_template_kwargs: Mapping[str, Any] | None,
    chat_openai: bool,
) -> dict[str, Any]:
    """The build's settings on record (``settings_of``), once the arguments that only
    conversations take are refused without ``chat``."""
    for name, value in (
        ("chat_template", chat_template),
        ("chat_template_kwargs", chat_template_kwargs),
    ):
        if chat is None and value is not None:
            raise ValueError(f"{name}= is for conversations; pass chat= (their field) too.")
    if chat is None:
        chat_tools = None  # a text build reads no tools
    if part_bytes is None and chat is not None:
        part_bytes = CHAT_PART_BYTES
    chat_fields = {"tools": chat_tools, "documents": chat_documents}
    return settings_of(
        chat or text,
        keep,
        txt,
        on_error,
        part_bytes,
        chat=chat is not None,
        chat_fields=chat_fields,
        chat_openai=chat_openai,
    )


def _worker_kind(chat: str | None, tokenizer: TokenizerArg) -> str:
    """What the workers run (``_worker``): text, or conversations with a tokenizer they
    load from its folder while this process does, or one given loaded."""
    if chat is None:
        return "prepare"
    if isinstance(tokenizer, str | os.PathLike):
        return "chat"
    return "chat-given"


def _share_to_write(
    root: str,
    plan: dict[str, Any],
    part: tuple[int, int] | None,
    storage_options: Mapping[str, Any] | None,
) -> list[int]:
    """The parts of this run's share (``part``) that have no manifest yet."""
    share = [p for p in range(len(plan["parts"])) if part is None or p % part[1] == part[0]]
    missing = set(missing_parts(root, len(plan["parts"]), storage_options))
    return [p for p in share if p in missing]


def _worker_init(
    root: str,
    plan: dict[str, Any],
    tok: Tokenizer | ChatTokenizer,
    threads: int,
    dataset: Any,
    storage_options: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """What every worker (a local process or a Ray task) starts from: the plan and how
    to build the tokenizer, write and read."""
    return {
        "path": list(sys.path),
        "plan": plan,
        "tokenizer": (tok.kind, tok.payload),
        "threads": threads,
        "out": root,
        "storage_options": dict(storage_options or {}),
        "dataset": pickle.dumps(dataset) if dataset is not None else None,
    }


def _write_parts(
    todo: list[int],
    init: dict[str, Any],
    pool: list[Any],
    executor: str,
    threads: int,
    progress: bool,
) -> tuple[float, int]:
    """Writes the parts ``todo`` on the started ``pool`` or as Ray tasks; returns the
    seconds it took and the tokens written."""
    start = time.perf_counter()
    with Report(len(todo), show=progress) as report:
        if todo and executor == "ray":
            run_ray(todo, init, threads, report)
        elif todo:
            run_local(pool, todo, init, report)
    return time.perf_counter() - start, report.counts["tokens"]


def prepare_status(
    out: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None
) -> PrepareStatus:
    """How far the ``prepare`` build in ``out`` is: parts written, missing, and totals."""
    root = os.fspath(out)
    record = read_json(join(root, RECORD), storage_options)
    if record is None:
        raise FileNotFoundError(
            f"{join(root, RECORD)} does not exist: {root} holds no meshfeed.prepare build."
        )
    return _status(
        root, record["plan"], storage_options, complete=record.get("complete") is not None
    )[0]


def _finish(
    root: str, plan: dict[str, Any], storage_options: Mapping[str, Any] | None
) -> PrepareStatus:
    """The build's status, its record marked complete (with the totals and every part's
    manifest) if no part is missing."""
    status, manifests = _status(root, plan, storage_options, complete=False)
    if not status.missing:
        totals = {k: getattr(status, k) for k in ("documents", "tokens", "empty", "skipped")}
        complete = {"parts": status.parts, **totals}
        record = {"format": RECORD_FORMAT, "plan": plan, "complete": complete}
        # Every part's manifest as one: what a host reads to open the build, from the
        # record, in one request (open_source), instead of a manifest a part.
        record["catalog"] = merge_manifests(manifests)
        write_record(root, record, storage_options)
        status = dataclasses.replace(status, complete=True)
    return status


def _status(
    root: str, plan: dict[str, Any], storage_options: Mapping[str, Any] | None, *, complete: bool
) -> tuple[PrepareStatus, list[tuple[str, dict[str, Any] | None]]]:
    """How far the build is, and each part's ``(folder, manifest or None)``."""
    count = len(plan["parts"])
    folders = [part_folder(i, count) for i in range(count)]
    manifests = [(f, read_json(join(root, f, MANIFEST), storage_options)) for f in folders]
    missing = [i for i, (_, m) in enumerate(manifests) if m is None]
    totals = {"documents": 0, "tokens": 0, "empty": 0, "skipped": 0}
    for _, manifest in manifests:
        for key in totals:
            totals[key] += (manifest or {}).get("prepare", {}).get(key, 0)
    status = PrepareStatus(
        out=root,
        parts=count,
        done=count - len(missing),
        missing=missing,
        complete=complete and not missing,
        **totals,
    )
    return status, manifests
