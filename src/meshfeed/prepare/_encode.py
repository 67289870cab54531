"""One part, encoded and written: its documents' tokens (and kept fields) as a part folder.

``write_part`` reads the part's documents (``_read``), encodes each batch without special
tokens, adds BOS and EOS ids explicitly (vectorised: the ids are placed around each
document's tokens in one numpy scatter), drops documents that encode to nothing
(counted as ``empty``), and writes shards of about ``SHARD_TOKENS`` tokens to
``out/part-i-of-n`` with ``write_folder``, whose manifest -- written last, whole or not
at all -- is what marks the part done. The manifest also holds the part's counts. A
part folder left by an interrupted run is removed first, so a redone part holds exactly
the files an uninterrupted run writes.

Strings kept beside the tokens (``keep=``) are stored as their UTF-8 bytes, one
``Ragged`` ``uint8`` document per record; numbers and booleans as arrays.
"""

from __future__ import annotations

import itertools
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from meshfeed.data._blob import is_url, require_fsspec
from meshfeed.data._folder import join, part_folder
from meshfeed.data._ragged import Ragged
from meshfeed.data._writer import FolderWriter, Shard, write_folder
from meshfeed.prepare._inputs import InputFile, Part
from meshfeed.prepare._read import documents

SHARD_TOKENS = 1 << 24
"""Tokens per shard, about (a shard ends at the first batch past it)."""
_KEPT_DTYPES = {"int": np.int64, "float": np.float64, "bool": np.bool_}
Counts = dict[str, int]
Progress = Callable[[int, int], None]  # (documents, tokens) written so far in this part


def write_part(
    index: int,
    plan: Mapping[str, Any],
    encode: Callable[[list[str]], list[list[int]]],
    out: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    dataset: Any = None,
    progress: Progress | None = None,
) -> Counts:
    """Encodes and writes part ``index`` of ``plan``; returns its counts."""
    parts: list[Part] = plan["parts"]
    files: list[InputFile] = plan["inputs"]
    settings, tokenizer = plan["settings"], plan["tokenizer"]
    root = join(out, part_folder(index, len(parts)))
    remove(root, storage_options)
    counts: Counts = {"documents": 0, "tokens": 0, "empty": 0, "skipped": 0}
    batches = documents(
        parts[index], files, settings, storage_options=storage_options, dataset=dataset
    )
    shards = _shards(batches, encode, tokenizer, settings, counts, progress)
    writer = FolderWriter(root, storage_options)
    write_folder(writer, shards, extra={"prepare": counts}, allow_empty=True)
    return counts


def remove(root: str, storage_options: Mapping[str, Any] | None) -> None:
    """Removes the folder ``root`` and what it holds, if it exists."""
    if not is_url(root):
        shutil.rmtree(root, ignore_errors=True)
        return
    fs, inner = require_fsspec().core.url_to_fs(root, **dict(storage_options or {}))
    if fs.exists(inner):
        fs.rm(inner, recursive=True)


def _shards(
    batches: Iterator[Any],
    encode: Callable[[list[str]], list[list[int]]],
    tokenizer: Mapping[str, Any],
    settings: Mapping[str, Any],
    counts: Counts,
    progress: Progress | None,
) -> Iterator[Shard]:
    dtype = np.dtype(settings["dtype"])
    vocab = int(tokenizer["vocab_size"])
    bos, eos = tokenizer["bos_id"], tokenizer["eos_id"]
    keep: Mapping[str, str] = settings["keep"]
    pending: list[tuple[np.ndarray, np.ndarray, dict[str, Any]]] = []
    pending_tokens = 0
    last = time.monotonic()
    for batch in batches:
        counts["skipped"] += batch.skipped
        if not batch.texts:
            continue
        ids = encode(batch.texts)
        if len(ids) != len(batch.texts):
            raise ValueError(
                f"the tokenizer returned {len(ids)} encodings for {len(batch.texts)} texts; "
                "encode must return one list of ids per text."
            )
        lengths = np.fromiter(map(len, ids), np.int64, count=len(ids))
        flat = np.fromiter(itertools.chain.from_iterable(ids), np.int64, count=int(lengths.sum()))
        if flat.size and (flat.min() < 0 or flat.max() >= vocab):
            bad = int(flat.max() if flat.max() >= vocab else flat.min())
            raise ValueError(
                f"the tokenizer returned id {bad}, outside its vocabulary of {vocab}; give "
                "the right vocab_size."
            )
        kept = {name: batch.kept[name] for name in keep}
        nonempty = lengths > 0
        if not nonempty.all():
            counts["empty"] += int((~nonempty).sum())
            kept = {
                n: [v for v, k in zip(vs, nonempty, strict=True) if k] for n, vs in kept.items()
            }
            lengths = lengths[nonempty]
        values, lengths = _with_specials(flat, lengths, bos, eos)
        pending.append((values.astype(dtype, copy=False), lengths, kept))
        pending_tokens += int(values.size)
        counts["documents"] += int(lengths.size)
        counts["tokens"] += int(values.size)
        if progress is not None and time.monotonic() - last > 0.5:
            progress(counts["documents"], counts["tokens"])
            last = time.monotonic()
        if pending_tokens >= SHARD_TOKENS:
            yield _shard(pending, keep, dtype)
            pending, pending_tokens = [], 0
    if pending and any(len(p[1]) for p in pending):
        yield _shard(pending, keep, dtype)
    if progress is not None:
        progress(counts["documents"], counts["tokens"])


def _with_specials(
    flat: np.ndarray, lengths: np.ndarray, bos: int | None, eos: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """Each document's tokens with BOS before and EOS after: values and new lengths."""
    extra = (bos is not None) + (eos is not None)
    if not extra:
        return flat, lengths
    new_lengths = lengths + extra
    starts = np.concatenate([[0], np.cumsum(new_lengths)[:-1]])
    out = np.empty(int(new_lengths.sum()), flat.dtype)
    document = np.repeat(np.arange(lengths.size), lengths)
    within = np.arange(flat.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    out[starts[document] + within + (bos is not None)] = flat
    if bos is not None:
        out[starts] = bos
    if eos is not None:
        out[starts + new_lengths - 1] = eos
    return out, new_lengths


def _shard(
    pending: list[tuple[np.ndarray, np.ndarray, dict[str, Any]]],
    keep: Mapping[str, str],
    dtype: np.dtype,
) -> Shard:
    lengths = np.concatenate([p[1] for p in pending])
    offsets = np.zeros(lengths.size + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    shard: Shard = {
        "tokens": Ragged(np.concatenate([p[0] for p in pending]).astype(dtype), offsets)
    }
    for name, kind in keep.items():
        values = [v for p in pending for v in p[2][name]]
        if kind == "str":
            shard[name] = Ragged.from_list([np.frombuffer(v, np.uint8) for v in values])
        else:
            shard[name] = np.asarray(values, _KEPT_DTYPES[kind])
    return shard


def worker_threads(workers: int) -> int:
    """Tokenizer threads per worker: the cores shared out, at least one each."""
    return max(1, (os.cpu_count() or 1) // max(1, workers))
