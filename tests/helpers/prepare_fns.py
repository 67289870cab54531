"""Corpora and tokenizers for the ``prepare`` tests, made here from Python's own sources."""

from __future__ import annotations

import gzip
import hashlib
import json
import sysconfig
from pathlib import Path
from typing import Any

import numpy as np

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def documents(count: int, *, max_chars: int = 3000, start: int = 0) -> list[dict[str, Any]]:
    """``count`` records ``{"id", "n", "text"}``: standard-library modules' first characters,
    with an empty document and a few unusual ones among them."""
    files = sorted(STDLIB.glob("*.py"))[start : start + count]
    records: list[dict[str, Any]] = []
    for n, path in enumerate(files):
        records.append(
            {"id": path.name, "n": n, "text": path.read_text(errors="replace")[:max_chars]}
        )
    records[3]["text"] = ""  # an empty document: dropped and counted
    records[5]["text"] = "naïve café — ﬁnance 漢字 🙂\n\ttabs"
    return records


def write_jsonl(
    folder: Path, records: list[dict[str, Any]], files: int, suffix: str = ".jsonl"
) -> list[Path]:
    """``records`` split in order over ``files`` files (``.jsonl``, ``.jsonl.gz`` or
    ``.jsonl.zst``); returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    per = -(-len(records) // files)
    paths = []
    for k in range(files):
        data = "".join(json.dumps(r) + "\n" for r in records[k * per : (k + 1) * per]).encode()
        path = folder / f"c{k:02d}{suffix}"
        if suffix.endswith(".gz"):
            data = gzip.compress(data, mtime=0)
        elif suffix.endswith(".zst"):
            import zstandard

            data = zstandard.ZstdCompressor().compress(data)
        path.write_bytes(data)
        paths.append(path)
    return paths


def write_parquet(path: Path, records: list[dict[str, Any]], row_group: int = 16) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({k: [r[k] for r in records] for k in ("id", "n", "text")})
    pq.write_table(table, path, row_group_size=row_group)
    return path


def train_tokenizer(
    path: Path, *, vocab_size: int = 600, template: bool = False, lowercase: bool = False
) -> Path:
    """A byte-level BPE trained on standard-library text, saved as ``tokenizer.json``.
    ``template``: a post-processor adding ``<s>`` and ``</s>``; ``lowercase``: the same
    model behind a lowercasing normaliser."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<s>", "</s>"] if template else ["<|endoftext|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator([r["text"] for r in documents(60, start=100)], trainer)
    if template:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>",
            special_tokens=[
                ("<s>", tokenizer.token_to_id("<s>")),
                ("</s>", tokenizer.token_to_id("</s>")),
            ],
        )
    if lowercase:
        tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.save(str(path))
    return path


def chat_tokenizer(
    folder: Path, text: str, specials: list[str], *, vocab_size: int, **hf_kwargs: Any
) -> Any:
    """A byte-level BPE trained on ``text`` with ``specials`` (``<unk>`` first), wrapped as
    a ``transformers`` fast tokenizer (``hf_kwargs``: its special tokens by role) and
    saved to ``folder``."""
    import tokenizers
    import transformers

    model = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, show_progress=False,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    model.train_from_iterator([text] * 20, trainer)
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=model, **hf_kwargs)
    hf.save_pretrained(folder)
    return hf


def tree(folder: Path) -> dict[str, str]:
    """Every file under ``folder``: relative path -> SHA-256 of its bytes."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def token_documents(source: Any) -> list[np.ndarray]:
    """Every document of a prepared folder's ``tokens`` field, in order."""
    return source[np.arange(len(source))]["tokens"].to_list()
