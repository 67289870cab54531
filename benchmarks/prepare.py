"""Workload T, text to tokens: ``meshfeed.prepare`` against the tokenizer alone (the limit),
``datasets.map`` + ``save_to_disk`` and datatrove, each in a fresh process; then a worker's
peak memory. Goal: >= 0.9x the limit and >= 1.25x each peer."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import arguments, emit, in_rounds, median_of, median_ratio, run_child, use_cpu_devices

LIMITS = ("limit:threads", "limit:processes")
PEERS = ("datasets", "datatrove")
ENTRIES = (*LIMITS, *PEERS, "meshfeed")


def make_corpus(folder: Path, max_mb: float, files: int = 8, copies: int = 1) -> tuple[Path, int]:
    """The stdlib's modules (``copies`` times over) as JSON Lines in ``folder/corpus``; bytes."""
    texts, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if "site-packages" not in path.parts and total < max_mb * 1e6:
            texts.append(path.read_text(errors="replace"))
            total += len(texts[-1].encode())
    corpus = folder / "corpus"
    corpus.mkdir(parents=True)
    lines = [json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts * copies)]
    for k in range(files):
        (corpus / f"stdlib-{k}.jsonl").write_text("".join(lines[k::files]))
    return corpus, total * copies


def byte_bpe(texts: list[str], vocab: int, specials: list[str], **model: Any) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` of ``vocab`` trained on ``texts``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(**model))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=specials, show_progress=False, initial_alphabet=alphabet
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def _limit(corpus: Path, tokenizer: str, out: Path, share: str = "0/1") -> dict:
    """The tokenizer alone on share ``k/n`` of the texts, already in memory: the ids of every
    text as Python lists in batches of 256 (the fastest of 16 to all at once, measured)."""
    from tokenizers import Tokenizer

    k, n = map(int, share.split("/"))
    lines = [line for p in sorted(corpus.glob("*.jsonl")) for line in p.read_text().splitlines()]
    texts = [json.loads(line)["text"] for line in lines][k::n]
    model = Tokenizer.from_file(tokenizer)
    start = time.perf_counter()
    tokens = 0
    for i in range(0, len(texts), 256):
        batch = model.encode_batch_fast(texts[i : i + 256], add_special_tokens=False)
        tokens += sum(len(e.ids) for e in batch)
    return {"seconds": time.perf_counter() - start, "tokens": tokens}


def _command(run: str, corpus: Path, tokenizer: str | Path, out: Path) -> list[str]:
    paths = ["--corpus", str(corpus), "--tokenizer", str(tokenizer), "--out", str(out)]
    return [__file__, "--run", run, *paths]


def _limit_processes(corpus: Path, tokenizer: str, out: Path) -> dict:
    """``_limit`` on a share of the texts in each of a process a core, one thread each."""
    cores = os.cpu_count() or 1
    command = [sys.executable, *_command("limit:threads", corpus, tokenizer, out), "--share"]
    env = {**os.environ, "RAYON_NUM_THREADS": "1"}
    shares = [
        subprocess.Popen([*command, f"{k}/{cores}"], stdout=subprocess.PIPE, text=True, env=env)
        for k in range(cores)
    ]
    results = [json.loads(p.communicate()[0].splitlines()[-1]) for p in shares]
    seconds = max(r["seconds"] for r in results)
    return {"seconds": seconds, "tokens": sum(r["tokens"] for r in results)}


def _datasets(corpus: Path, tokenizer: str, out: Path) -> dict:
    import datasets
    from tokenizers import Tokenizer

    datasets.disable_progress_bars()
    model = Tokenizer.from_file(tokenizer)

    def tokenize(batch: dict) -> dict:
        ids = [e.ids for e in model.encode_batch_fast(batch["text"], add_special_tokens=False)]
        return {"input_ids": ids}

    start = time.perf_counter()
    files = sorted(str(p) for p in corpus.glob("*.jsonl"))
    cache = str(out / "cache")
    ds = datasets.load_dataset("json", data_files=files, split="train", cache_dir=cache)
    options = {"num_proc": 2, "remove_columns": ds.column_names, "load_from_cache_file": False}
    mapped = ds.map(tokenize, batched=True, **options)
    mapped.save_to_disk(str(out / "tokens"))
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens": int(sum(map(len, mapped["input_ids"])))}


def _datatrove(corpus: Path, tokenizer: str, out: Path) -> dict:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.tokens import DocumentTokenizer

    start = time.perf_counter()
    options = {"eos_token": "<|endoftext|>", "shuffle_documents": False}
    tokenize = DocumentTokenizer(str(out / "tokens"), tokenizer_name_or_path=tokenizer, **options)
    pipeline = [JsonlReader(str(corpus), glob_pattern="*.jsonl"), tokenize]
    logs = str(out / "logs")
    LocalPipelineExecutor(pipeline=pipeline, tasks=2, workers=2, logging_dir=logs).run()
    return {"seconds": time.perf_counter() - start, "tokens": None}


def _meshfeed(corpus: Path, tokenizer: str, out: Path) -> dict:
    import meshfeed

    start = time.perf_counter()
    options = {"tokenizer": tokenizer, "workers": 2, "progress": False}
    status = meshfeed.prepare(str(corpus / "*.jsonl"), out / "tokens", **options)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens": status.tokens - status.documents}  # EOS left out


RUNS: dict[str, Callable[..., dict]] = {
    "limit:threads": _limit,
    "limit:processes": _limit_processes,
    "datasets": _datasets,
    "datatrove": _datatrove,
    "meshfeed": _meshfeed,
}


def _child(args: argparse.Namespace) -> None:
    """Entry ``args.run``, with its peak memory and the largest peak (``VmHWM``) of any
    process it starts, sampled every 20 ms (``getrusage(RUSAGE_CHILDREN)`` would not do: a
    forked child starts with its parent's peak, which outlives the ``exec``)."""
    import psutil

    peak_kib, stop = [0], threading.Event()

    def watch() -> None:
        while not stop.wait(0.02):
            for child in psutil.Process().children(recursive=True):
                with contextlib.suppress(OSError), open(f"/proc/{child.pid}/status") as f:
                    peaks = [int(line.split()[1]) for line in f if line.startswith("VmHWM:")]
                    peak_kib[0] = max([peak_kib[0], *peaks])

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    share = [args.share] if args.share else []
    result = RUNS[args.run](Path(args.corpus), args.tokenizer, Path(args.out), *share)
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    stop.set()
    watcher.join()
    result["peak_child_rss_mib"] = peak_kib[0] / 1024
    print(json.dumps(result))


def run_entry(name: str, corpus: Path, tokenizer: Path, scratch: Path) -> dict:
    out = scratch / name.replace(":", "_")
    out.mkdir(parents=True)  # removed after each run
    try:
        return run_child(_command(name, corpus, tokenizer, out))
    except RuntimeError as error:
        return {"error": str(error).strip().splitlines()[-1]}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-mb", type=float, default=30.0, help="text in the corpus, MB")
    parser.add_argument("--vocab", type=int, default=16384)
    parser.add_argument("--copies", type=int, default=1, help="the corpus this many times over")
    parser.add_argument("--entries", default=",".join(ENTRIES), help="comma-separated")
    parser.add_argument("--no-memory", action="store_true", help="skip the worker-memory lines")
    for flag in ("--run", "--corpus", "--tokenizer", "--out", "--share"):
        parser.add_argument(flag, default=None, help=argparse.SUPPRESS)


def main() -> None:
    smoke = {"rounds": 1, "max_mb": 1.0, "vocab": 2048}
    args = arguments(__doc__, rounds=3, smoke=smoke, add=_flags)
    if args.run:
        _child(args)
        return
    use_cpu_devices()  # JAX in this process only says the devices on each line
    with tempfile.TemporaryDirectory(prefix="meshfeed-prepare-bench-") as scratch:
        _rounds(args, Path(scratch))


def _rounds(args: argparse.Namespace, scratch: Path) -> None:
    corpus, size = make_corpus(scratch, args.max_mb, copies=args.copies)
    tokenizer = scratch / "tokenizer.json"
    with open(corpus / "stdlib-0.jsonl") as f:
        texts = [json.loads(line)["text"] for line in f]
    byte_bpe(texts, args.vocab, ["<|endoftext|>"]).save(str(tokenizer))
    base = {"workload": "T", "corpus_mb": round(size / 1e6, 1), "vocab": args.vocab}
    base["smoke"] = args.smoke
    chosen = [e for e in ENTRIES if e in args.entries.split(",")]
    entries = {e: lambda e=e: run_entry(e, corpus, tokenizer, scratch) for e in chosen}
    per_round = in_rounds(entries, args.rounds, pause=0.0)
    tokens = next(e["tokens"] for e in per_round[0].values() if e.get("tokens"))
    for got in per_round:  # tokens/s of each entry, and of the faster limit as ``limit``
        for entry in got.values():
            entry["rate"] = tokens / entry["seconds"] if "seconds" in entry else 0.0
        got["limit"] = {"rate": max(got[n]["rate"] for n in LIMITS)}
    for name in chosen:
        runs = [r[name] for r in per_round]
        line = {**base, "name": name, "rounds": len(runs)}
        errors = [x["error"] for x in runs if "error" in x]
        if errors:
            emit("prepare", **line, error=errors[0])
            continue
        counted = [x["tokens"] for x in runs if x.get("tokens") is not None]
        line |= {"tokens": tokens, "tokens_agree": all(c == tokens for c in counted)}
        line["tokens_per_s"] = round(median_of(per_round, name, "rate") or 0.0)
        line["ratio_to_limit"] = median_ratio(per_round, name, "limit", "rate")
        for peer in PEERS:
            if name != peer and peer in chosen and all(r[peer]["rate"] for r in per_round):
                line[f"ratio_to_{peer}"] = median_ratio(per_round, name, peer, "rate")
        for key in ("peak_rss_mib", "peak_child_rss_mib"):
            line[key] = round(max(x[key] for x in runs))
        emit("prepare", **line)
    if not args.no_memory:
        _memory(corpus, tokenizer, scratch, base)


def _memory(corpus: Path, tokenizer: Path, scratch: Path, base: dict[str, Any]) -> None:
    """Peak memory of a prepare worker: on the corpus, and on four copies of it."""
    copies = scratch / "copies"
    copies.mkdir()
    for r in range(4):
        for p in sorted(corpus.glob("*.jsonl")):
            shutil.copy(p, copies / f"{r}-{p.name}")
    for label, folder in (("the corpus", corpus), ("four copies of it", copies)):
        peak = round(run_entry("meshfeed", folder, tokenizer, scratch)["peak_child_rss_mib"])
        mb = round(sum(p.stat().st_size for p in folder.glob("*.jsonl")) / 1e6, 1)
        name = f"meshfeed worker memory, {label}"
        emit("prepare", **base, name=name, input_mb=mb, worker_peak_rss_mib=peak)


if __name__ == "__main__":
    main()
