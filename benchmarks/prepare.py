"""Workload T, text to tokens: ``meshfeed.prepare`` against the tokenizer alone and two peers.

The stdlib's ``.py`` sources as JSON Lines, a 16k BPE trained here: ``meshfeed.prepare``
(2 workers) against the tokenizer alone (``limit:threads``, ``limit:processes``),
``datasets.map(num_proc=2)`` + ``save_to_disk`` and datatrove (2 tasks), each in a fresh
process, rotating rounds; then a worker's peak memory. Goal: >= 0.9x the limit and >= 1.25x
each peer. ``--smoke`` for CI; the workload is in ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import arguments, emit, in_rounds, run_child, use_cpu_devices

ENTRIES = ("limit:threads", "limit:processes", "datasets", "datatrove", "meshfeed")


def make_corpus(folder: Path, max_mb: float, files: int = 8, copies: int = 1) -> tuple[Path, int]:
    """The stdlib's modules as JSON Lines under ``folder/corpus`` (``copies`` times over,
    for a corpus larger than the stdlib); returns it and its bytes."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts, total = [], 0
    for path in sorted(stdlib.rglob("*.py")):
        if "site-packages" in path.parts or total >= max_mb * 1e6:
            continue
        text = path.read_text(errors="replace")
        texts.append(text)
        total += len(text.encode())
    texts, total = texts * copies, total * copies
    corpus = folder / "corpus"
    corpus.mkdir(parents=True)
    for k in range(files):
        with open(corpus / f"stdlib-{k}.jsonl", "w") as f:
            f.writelines(
                json.dumps({"id": i, "text": t}) + "\n"
                for i, t in enumerate(texts)
                if i % files == k
            )
    return corpus, total


def train_tokenizer(corpus: Path, path: Path, vocab: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    with open(corpus / "stdlib-0.jsonl") as f:
        texts = [json.loads(line)["text"] for line in f]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<|endoftext|>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.save(str(path))


# -- each entry, in its own process (``--run NAME``) ----------------------------------------


def _texts(corpus: Path) -> list[str]:
    return [json.loads(line)["text"] for p in sorted(corpus.glob("*.jsonl")) for line in open(p)]


def _encode_all(model: object, texts: list[str]) -> int:
    """The ids of every text as Python lists -- the tokenizer's output -- in batches of 256
    (the fastest of 16 to all at once, measured here); returns how many."""
    tokens = 0
    for i in range(0, len(texts), 256):
        batch = model.encode_batch_fast(texts[i : i + 256], add_special_tokens=False)  # type: ignore[attr-defined]
        tokens += sum(len(e.ids) for e in batch)
    return tokens


def _limit(corpus: Path, tokenizer: str, share: str = "0/1") -> dict:
    """The tokenizer alone on share ``k/n`` of the texts, already in memory."""
    from tokenizers import Tokenizer

    k, n = map(int, share.split("/"))
    texts = _texts(corpus)[k::n]
    model = Tokenizer.from_file(tokenizer)
    start = time.perf_counter()
    tokens = _encode_all(model, texts)
    return {"seconds": time.perf_counter() - start, "tokens": tokens}


def _limit_threads(corpus: Path, tokenizer: str, out: Path) -> dict:
    return _limit(corpus, tokenizer)


def _command(run: str, corpus: Path, tokenizer: str | Path, out: Path) -> list[str]:
    """The command line of a fresh process that runs entry ``run`` (``--run``)."""
    paths = ["--corpus", str(corpus), "--tokenizer", str(tokenizer), "--out", str(out)]
    return [__file__, "--run", run, *paths]


def _limit_processes(corpus: Path, tokenizer: str, out: Path) -> dict:
    cores = os.cpu_count() or 1
    env = {**os.environ, "RAYON_NUM_THREADS": "1"}
    shares = [
        subprocess.Popen(
            [sys.executable, *_command("share", corpus, tokenizer, out), "--share", f"{k}/{cores}"],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for k in range(cores)
    ]
    results = [json.loads(p.communicate()[0].splitlines()[-1]) for p in shares]
    return {
        "seconds": max(r["seconds"] for r in results),
        "tokens": sum(r["tokens"] for r in results),
    }


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
    ds = datasets.load_dataset(
        "json", data_files=files, split="train", cache_dir=str(out / "cache")
    )
    mapped = ds.map(
        tokenize,
        batched=True,
        num_proc=2,
        remove_columns=ds.column_names,
        load_from_cache_file=False,
    )
    mapped.save_to_disk(str(out / "tokens"))
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens": int(sum(map(len, mapped["input_ids"])))}


def _datatrove(corpus: Path, tokenizer: str, out: Path) -> dict:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.tokens import DocumentTokenizer

    start = time.perf_counter()
    tokenize = DocumentTokenizer(
        str(out / "tokens"),
        tokenizer_name_or_path=tokenizer,
        eos_token="<|endoftext|>",
        shuffle_documents=False,
    )
    pipeline = [JsonlReader(str(corpus), glob_pattern="*.jsonl"), tokenize]
    LocalPipelineExecutor(
        pipeline=pipeline, tasks=2, workers=2, logging_dir=str(out / "logs")
    ).run()
    return {"seconds": time.perf_counter() - start, "tokens": None}


def _meshfeed(corpus: Path, tokenizer: str, out: Path) -> dict:
    import meshfeed

    start = time.perf_counter()
    inputs = str(corpus / "*.jsonl")
    status = meshfeed.prepare(
        inputs, out / "tokens", tokenizer=tokenizer, workers=2, progress=False
    )
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens": status.tokens - status.documents}  # EOS left out


RUNS = {
    "limit:threads": _limit_threads,
    "limit:processes": _limit_processes,
    "datasets": _datasets,
    "datatrove": _datatrove,
    "meshfeed": _meshfeed,
}


class _ChildPeaks:
    """The largest peak resident memory (``VmHWM``) of any descendant process, sampled
    every 20 ms. (``getrusage(RUSAGE_CHILDREN)`` would not do: a forked child starts
    with its parent's peak, which outlives the ``exec``.)"""

    def __init__(self) -> None:
        import threading

        self.peak_kib, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._stop.wait(0.02):
            for child in me.children(recursive=True):
                try:
                    with open(f"/proc/{child.pid}/status") as f:
                        for line in f:
                            if line.startswith("VmHWM:"):
                                self.peak_kib = max(self.peak_kib, int(line.split()[1]))
                except OSError:
                    pass

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak_kib / 1024


def _child(args: argparse.Namespace) -> None:
    peaks = _ChildPeaks()
    if args.run == "share":
        result = _limit(Path(args.corpus), args.tokenizer, args.share)
    else:
        result = RUNS[args.run](Path(args.corpus), args.tokenizer, Path(args.out))
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["peak_child_rss_mib"] = peaks.stop()
    print(json.dumps(result))


def run_entry(name: str, corpus: Path, tokenizer: Path, scratch: Path) -> dict:
    out = scratch / name.replace(":", "_")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
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
    scratch = Path(tempfile.mkdtemp(prefix="meshfeed-prepare-bench-"))
    try:
        _rounds(args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _rounds(args: argparse.Namespace, scratch: Path) -> None:
    corpus, size = make_corpus(scratch, args.max_mb, copies=args.copies)
    tokenizer = scratch / "tokenizer.json"
    train_tokenizer(corpus, tokenizer, args.vocab)
    base = {"workload": "T", "corpus_mb": round(size / 1e6, 1), "vocab": args.vocab}
    base["smoke"] = args.smoke
    entries = {
        e: lambda e=e: run_entry(e, corpus, tokenizer, scratch)
        for e in ENTRIES
        if e in args.entries.split(",")
    }
    per_round = in_rounds(entries, args.rounds, pause=0.0)
    tokens = next(e["tokens"] for e in per_round[0].values() if e.get("tokens"))

    def rate(entry: dict) -> float | None:
        return tokens / entry["seconds"] if "seconds" in entry else None

    def limit(round_: dict) -> float:
        return max(rate(round_[n]) or 0.0 for n in ("limit:threads", "limit:processes"))

    def ratio(name: str, to: Any) -> float:
        return round(statistics.median((rate(r[name]) or 0) / to(r) for r in per_round), 3)

    for name in entries:
        runs = [r[name] for r in per_round]
        line = {**base, "name": name, "rounds": len(runs)}
        if any("error" in x for x in runs):
            emit("prepare", **line, error=next(x["error"] for x in runs if "error" in x))
            continue
        counted = [x["tokens"] for x in runs if x.get("tokens") is not None]
        line["tokens"] = tokens
        line["tokens_agree"] = all(c == tokens for c in counted)
        line["tokens_per_s"] = round(statistics.median(rate(x) or 0.0 for x in runs))
        line["ratio_to_limit"] = ratio(name, limit)
        for peer in ("datasets", "datatrove"):
            if name != peer and peer in entries and "error" not in per_round[0][peer]:
                line[f"ratio_to_{peer}"] = ratio(name, lambda r, p=peer: rate(r[p]) or 1)
        line["peak_rss_mib"] = round(max(x["peak_rss_mib"] for x in runs))
        line["peak_child_rss_mib"] = round(max(x["peak_child_rss_mib"] for x in runs))
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
        entry = run_entry("meshfeed", folder, tokenizer, scratch)
        mb = sum(p.stat().st_size for p in folder.glob("*.jsonl")) / 1e6
        name = f"meshfeed worker memory, {label}"
        peak = round(entry["peak_child_rss_mib"])
        emit("prepare", **base, name=name, input_mb=round(mb, 1), worker_peak_rss_mib=peak)


if __name__ == "__main__":
    main()
