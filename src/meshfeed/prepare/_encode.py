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

Conversations (``chat``) are encoded as their chat template renders them, nothing added
(``_chat``), and a ``loss_mask`` field is written beside the tokens, one value a token.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from meshfeed.data._folder import join, part_folder
from meshfeed.data._ragged import Ragged
from meshfeed.data._tokenizer import Encoded
from meshfeed.data._writer import FolderWriter, Shard, write_folder
from meshfeed.prepare._chat import ChatEncoded
from meshfeed.prepare._inputs import InputFile, Part
from meshfeed.prepare._read import documents

SHARD_TOKENS = 1 << 24
"""Tokens per shard, about (a shard ends at the first batch past it)."""
_KEPT_DTYPES = {"int": np.int64, "float": np.float64, "bool": np.bool_}
Counts = dict[str, int]
Progress = Callable[[int, int], None]  # (documents, tokens) written so far in this part
Pending = tuple[np.ndarray, np.ndarray, dict[str, Any], np.ndarray | None]  # ids, lengths,
# kept fields, loss mask (conversations) of a batch not yet in a shard


def write_part(
    index: int,
    plan: Mapping[str, Any],
    encode: Callable[[list[str]], Encoded | ChatEncoded],
    out: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    dataset: Any = None,
    progress: Progress | None = None,
) -> Counts:
    """Encodes and writes part ``index`` of ``plan``; returns its counts."""
    parts: list[Part] = plan["parts"]
    files: list[InputFile] = plan["inputs"]
    settings = plan["settings"]
    tokenizer = plan["tokenizer"]
    root = join(out, part_folder(index, len(parts)))
    FolderWriter(root, storage_options).clear()
    counts: Counts = {"documents": 0, "tokens": 0, "empty": 0, "skipped": 0}
    batches = documents(
        parts[index], files, settings, storage_options=storage_options, dataset=dataset
    )
    shards = _shards(batches, encode, tokenizer, settings, counts, progress)
    writer = FolderWriter(root, storage_options)
    write_folder(writer, shards, extra={"prepare": counts}, allow_empty=True)
    return counts


def _shards(
    batches: Iterator[Any],
    encode: Callable[[list[str]], Encoded | ChatEncoded],
    tokenizer: Mapping[str, Any],
    settings: Mapping[str, Any],
    counts: Counts,
    progress: Progress | None,
) -> Iterator[Shard]:
    dtype = np.dtype(settings["dtype"])
    vocab = int(tokenizer["vocab_size"])
    bos, eos = tokenizer["bos_id"], tokenizer["eos_id"]
    keep: Mapping[str, str] = settings["keep"]
    pending: list[Pending] = []
    pending_tokens = 0
    last = time.monotonic()
    extra = [i for i in (bos, eos) if i is not None]
    for batch in batches:
        counts["skipped"] += batch.skipped
        if not batch.texts:
            continue
        encoded = encode(batch.texts)
        lengths, ids = encoded[0], encoded[1]
        masks = encoded[2] if len(encoded) == 3 else None  # conversations: the loss mask
        kept = {name: batch.kept[name] for name in keep}
        nonempty = lengths > 0
        if not nonempty.all():  # dropped: no tokens, so no document (nor BOS/EOS)
            counts["empty"] += int((~nonempty).sum())
            kept = {
                n: [v for v, k in zip(vs, nonempty, strict=True) if k] for n, vs in kept.items()
            }
            ids = (d for d, k in zip(ids, nonempty, strict=True) if k)
            if masks is not None:
                masks = [m for m, k in zip(masks, nonempty, strict=True) if k]
            lengths = lengths[nonempty]
        values = _flat(ids, lengths, bos, eos, dtype, vocab)
        flags = None
        if masks is not None:  # one value a token (nothing is added around conversations)
            flags = np.concatenate([np.zeros(0, bool), *(np.asarray(m, bool) for m in masks)])
            assert flags.size == values.size, (flags.size, values.size)
        lengths = lengths + len(extra)
        pending.append((values, lengths, kept, flags))
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


def _flat(
    ids: Iterable[Iterable[int]],
    lengths: np.ndarray,
    bos: int | None,
    eos: int | None,
    dtype: np.dtype,
    vocab: int,
) -> np.ndarray:
    """Every document's ids, with BOS before and EOS after, one after another, in ``dtype``
    (straight from the tokenizer's output: no list of lists, no wider array)."""
    before, after = (() if bos is None else (bos,)), (() if eos is None else (eos,))
    if before or after:
        ids = (itertools.chain(before, d, after) for d in ids)
    total = int(lengths.sum()) + lengths.size * (len(before) + len(after))
    try:
        flat = np.fromiter(itertools.chain.from_iterable(ids), dtype, count=total)
    except (OverflowError, ValueError) as error:
        raise ValueError(
            f"the tokenizer returned an id outside its vocabulary of {vocab} ({error}); give "
            "the right vocab_size."
        ) from None
    if vocab <= np.iinfo(dtype).max and flat.size and flat.max() >= vocab:
        raise ValueError(
            f"the tokenizer returned id {int(flat.max())}, outside its vocabulary of {vocab}; "
            "give the right vocab_size."
        )
    return flat


def _shard(pending: list[Pending], keep: Mapping[str, str], dtype: np.dtype) -> Shard:
    lengths = np.concatenate([p[1] for p in pending])
    offsets = np.zeros(lengths.size + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    shard: Shard = {"tokens": Ragged(np.concatenate([p[0] for p in pending]), offsets)}
    masks = [p[3] for p in pending if p[3] is not None]
    if masks:  # conversations: every batch has one
        shard["loss_mask"] = Ragged(np.concatenate(masks), offsets)
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
