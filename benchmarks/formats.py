"""Workload W, streaming formats (README.md): ``TarSource`` against webdataset, samples/s;
``meshfeed.index`` (``--ray``: on a local Ray too) against reading the files once, MB/s.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from decode_fns import decode_crop, decode_crop_seeded, encode_all
from harness import arguments, emit, in_rounds, median_of, median_ratio, use_cpu_devices

import meshfeed
from common import loader_batches, measure, to_global

BATCH = 256


def crop(record: dict[str, Any], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The decode workload's work on a WebDataset sample (``png`` and ``cls``)."""
    return decode_crop({"png": record["png"], "label": record["cls"]}, rng)


def _crop_sample(sample: dict[str, Any]) -> dict[str, np.ndarray]:
    """webdataset's ``map``: the same work, with a generator per sample's key."""
    return decode_crop_seeded(sample["png"], int(sample["cls"]), int(sample["__key__"]))


def _collate(samples: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The batch's arrays: webdataset keeps each sample's ``__key__`` and ``__url__``."""
    return {k: np.stack([s[k] for s in samples]) for k in ("image", "label")}


def write_shards(folder: Path, n: int, shards: int) -> list[str]:
    from webdataset.writer import ShardWriter

    folder.mkdir()
    encoded, labels = encode_all(n)
    with ShardWriter(str(folder / "shard-%03d.tar"), maxcount=-(-n // shards), verbose=0) as sink:
        for i in range(n):
            sink.write({"__key__": f"{i:07d}", "png": encoded[i], "cls": str(int(labels[i]))})
    return sorted(str(p) for p in folder.glob("shard-*.tar"))


def write_jsonl(folder: Path, total_mb: float, files: int = 8) -> list[str]:
    folder.mkdir()
    rng = np.random.default_rng(0)
    paths = [str(folder / f"chat-{k}.jsonl") for k in range(files)]
    for path in paths:
        with open(path, "wb") as f:
            i = 0
            while f.tell() < int(total_mb * 1e6 / files):
                words = "word " * int(rng.integers(20, 400))
                f.write(json.dumps({"id": i, "text": words}).encode() + b"\n")
                i += 1
    return paths


def write_tfrecords(folder: Path, total_mb: float, files: int = 8) -> list[str]:
    from tfrecord.writer import TFRecordWriter

    folder.mkdir()
    rng = np.random.default_rng(0)
    paths = [str(folder / f"part-{k}.tfrecord") for k in range(files)]
    for path in paths:
        writer = TFRecordWriter(path)
        written = 0
        while written < int(total_mb * 1e6 / files):
            image = rng.integers(0, 255, int(rng.integers(1000, 6000)), np.uint8).tobytes()
            writer.write({"image": (image, "byte"), "label": (int(rng.integers(10)), "int")})
            written += len(image) + 40
        writer.close()
    return paths


def _webdataset(shards: list[str]) -> Any:
    from torch.utils.data import DataLoader
    from webdataset.compat import WebDataset

    pipeline = (
        WebDataset(shards, shardshuffle=len(shards), empty_check=False)
        .repeat()
        .shuffle(1000)  # pyright: ignore[reportAttributeAccessIssue]
        .map(_crop_sample)
        .batched(BATCH, collation_fn=_collate, partial=False)
    )
    # batch_size=None: the pipeline batches; collate_fn keeps its numpy batches as they are
    loader = DataLoader(
        pipeline, batch_size=None, num_workers=2, persistent_workers=True, collate_fn=lambda b: b
    )
    return to_global(iter(loader), BATCH)


def _loading(args: argparse.Namespace, paths: list[str], common: dict[str, Any]) -> None:
    meshfeed.index(paths, progress=False)
    source = meshfeed.sources.TarSource(paths, decode={"cls": "int"}, key=None)
    runs = {
        "meshfeed": loader_batches(lambda: source, BATCH, record_transform=crop, num_workers=2),
        "webdataset": partial(_webdataset, paths),
    }
    entries = {name: partial(measure, run, BATCH, args.seconds) for name, run in runs.items()}
    per_round = in_rounds(entries, args.rounds, pause=0.0)
    for name in entries:
        emit(
            "formats",
            **common,
            part="loading",
            name=name,
            samples_per_s=round(median_of(per_round, name) or 0),
            ratio_to_webdataset=median_ratio(per_round, name, "webdataset"),
        )


def _evict(paths: list[str]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def _read_once(paths: list[str]) -> float:
    """MB/s of reading ``paths`` once from disk."""
    _evict(paths)
    start = time.perf_counter()
    for p in paths:
        with open(p, "rb") as f:
            while f.read(8 << 20):
                pass
    return sum(os.path.getsize(p) for p in paths) / (time.perf_counter() - start) / 1e6


def _index_once(paths: list[str], executor: Any, per_sample: dict[str, int]) -> float:
    """MB/s of indexing ``paths`` from disk; the index's bytes per sample into ``per_sample``."""
    for p in paths:
        Path(p + ".meshfeed-index.npz").unlink(missing_ok=True)
    _evict(paths)
    start = time.perf_counter()
    report = meshfeed.index(paths, workers=2, executor=executor, progress=False)
    seconds = time.perf_counter() - start
    index_bytes = sum(os.path.getsize(p + ".meshfeed-index.npz") for p in paths)
    per_sample[executor] = index_bytes // max(1, report.samples)
    return sum(os.path.getsize(p) for p in paths) / seconds / 1e6


def _indexing(args: argparse.Namespace, sets: dict[str, list[str]], common: dict[str, Any]) -> None:
    executors = ["local"] + (["ray"] if args.ray else [])
    for kind, files in sets.items():
        per_sample: dict[str, int] = {}  # index bytes per sample, by executor
        entries = {"read": partial(_read_once, files)}
        entries |= {what: partial(_index_once, files, what, per_sample) for what in executors}
        per_round = in_rounds(entries, args.rounds, pause=0.0)
        mb = round(sum(os.path.getsize(p) for p in files) / 1e6, 1)
        for what in executors:
            emit(
                "formats",
                **common,
                part="indexing",
                name=kind,
                executor=what,
                files=len(files),
                mb=mb,
                index_mb_per_s=round(median_of(per_round, what) or 0),
                read_mb_per_s=round(median_of(per_round, "read") or 0),
                ratio_to_read=median_ratio(per_round, what, "read"),
                index_bytes_per_sample=per_sample[what],
            )


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--part", choices=("all", "loading", "indexing"), default="all")
    parser.add_argument("--ray", action="store_true", help="time executor='ray' as well")
    parser.add_argument("--big", action="store_true", help="index tar-64 (~1 GB) as well")
    parser.add_argument("--sets", default=None, help="indexing: these sets only (comma-separated)")


def main() -> None:
    use_cpu_devices()
    args = arguments(__doc__, seconds=3.0, rounds=5, add=_flags)
    n, shards, mb = (1024, 2, 2.0) if args.smoke else (20_000, 8, 100.0)
    common = {"smoke": args.smoke, "workload": "W", "rounds": args.rounds}
    with tempfile.TemporaryDirectory(prefix="meshfeed-formats-bench-") as folder:
        scratch = Path(folder)
        paths = write_shards(scratch / "wds", n, shards)
        if args.part in ("all", "loading"):
            _loading(args, paths, common)
        if args.part == "loading":
            return
        sets = {
            "tar": paths,
            "tar-16": write_shards(scratch / "wds16", 2 * n, 2 * shards),
            "jsonl": write_jsonl(scratch / "jsonl", mb),
            "tfrecord": write_tfrecords(scratch / "tfrecord", mb),
        }
        if args.big:
            sets["tar-64"] = write_shards(scratch / "wds64", 8 * n, 64)
        if args.ray:
            import ray

            cores = os.cpu_count() or 1
            ray.init(address="local", num_cpus=cores, include_dashboard=False, log_to_driver=False)
            warm = write_jsonl(scratch / "warm", 0.01, files=2 * cores)
            meshfeed.index(warm, executor="ray", progress=False)  # its workers started
        if args.sets:
            sets = {k: v for k, v in sets.items() if k in args.sets.split(",")}
        _indexing(args, sets, common)
        if args.ray:
            ray.shutdown()  # pyright: ignore[reportPossiblyUnboundVariable]


if __name__ == "__main__":
    main()
