"""Workload W, streaming formats: WebDataset shards read by index, and how fast files index.

Loading: ``TarSource`` in a ``Loader`` (2 record workers) against webdataset's own pipeline
in a PyTorch ``DataLoader`` (2 workers), samples/s; goal >= 1.1x. Indexing:
``meshfeed.index`` (``--ray``: on a local Ray too) against reading the files once, page
cache evicted; goal >= 0.5x. ``--part indexing`` skips loading. ``--smoke`` for CI; the
workload is in ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import jax
import numpy as np
from decode_fns import decode_crop, encode_all
from harness import arguments, emit, in_rounds, median_of, median_ratio, use_cpu_devices

import meshfeed
from common import measure, to_global

BATCH = 256


def crop(record: dict[str, Any], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The decode workload's work on a WebDataset sample (``png`` and ``cls``)."""
    return decode_crop({"png": record["png"], "label": record["cls"]}, rng)


def write_shards(folder: Path, n: int, shards: int) -> list[str]:
    from webdataset.writer import ShardWriter

    encoded, labels = encode_all(n)
    with ShardWriter(str(folder / "shard-%03d.tar"), maxcount=-(-n // shards), verbose=0) as sink:
        for i in range(n):
            sink.write({"__key__": f"{i:07d}", "png": encoded[i], "cls": str(int(labels[i]))})
    return sorted(str(p) for p in folder.glob("shard-*.tar"))


def _meshfeed(shards: list[str]) -> Callable[[], Iterator[Any]]:
    meshfeed.index(shards, progress=False)
    source = meshfeed.sources.TarSource(shards, decode={"cls": "int"}, key=None)
    sharding = meshfeed.batch_sharding(meshfeed.make_mesh(data=jax.device_count()))

    def run() -> Iterator[Any]:
        loader = meshfeed.Loader(
            source,
            global_batch_size=BATCH,
            sharding=sharding,
            num_epochs=None,
            record_transform=crop,
            num_workers=2,
        )
        try:
            yield from loader
        finally:
            loader.close()

    return run


class _Crop:
    """webdataset's ``map``: decode and crop one sample, a generator per sample's key."""

    def __call__(self, sample: dict[str, Any]) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(int(sample["__key__"]))
        return decode_crop({"png": sample["png"], "label": int(sample["cls"])}, rng)


def _same(batch: Any) -> Any:
    """The DataLoader's collation: the batch as the pipeline made it (numpy)."""
    return batch


def _collate(samples: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.stack([s[k] for s in samples]) for k in ("image", "label")}


def _webdataset(shards: list[str]) -> Callable[[], Iterator[Any]]:
    from torch.utils.data import DataLoader
    from webdataset.compat import WebDataset

    def run() -> Iterator[Any]:
        pipeline = (
            WebDataset(shards, shardshuffle=len(shards), empty_check=False)
            .repeat()
            .shuffle(1000)
            .map(_Crop())
            .batched(BATCH, collation_fn=_collate, partial=False)
        )
        loader = DataLoader(
            pipeline, batch_size=None, num_workers=2, persistent_workers=True, collate_fn=_same
        )
        yield from to_global(iter(loader), BATCH)

    return run


def _evict(paths: list[str]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _read_once(paths: list[str]) -> float:
    _evict(paths)
    start = time.perf_counter()
    for p in paths:
        with open(p, "rb") as f:
            while f.read(8 << 20):
                pass
    return time.perf_counter() - start


def _index_once(paths: list[str], executor: str, per_sample: dict[str, int]) -> float:
    """Seconds to index ``paths`` from disk; the index's bytes per sample into ``per_sample``."""
    for p in paths:
        Path(p + ".meshfeed-index.npz").unlink(missing_ok=True)
    _evict(paths)
    start = time.perf_counter()
    report = meshfeed.index(paths, workers=2, executor=executor, progress=False)
    seconds = time.perf_counter() - start
    index_bytes = sum(os.path.getsize(p + ".meshfeed-index.npz") for p in paths)
    per_sample[executor] = index_bytes // max(1, report.samples)
    return seconds


def write_jsonl(folder: Path, total_mb: float, files: int = 8) -> list[str]:
    rng = np.random.default_rng(0)
    per = int(total_mb * 1e6 / files)
    paths = []
    for k in range(files):
        path = folder / f"chat-{k}.jsonl"
        with open(path, "w") as f:
            written, i = 0, 0
            while written < per:
                line = json.dumps({"id": i, "text": "word " * int(rng.integers(20, 400))}) + "\n"
                f.write(line)
                written, i = written + len(line), i + 1
        paths.append(str(path))
    return paths


def write_tfrecords(folder: Path, total_mb: float, files: int = 8) -> list[str]:
    from tfrecord.writer import TFRecordWriter

    rng = np.random.default_rng(0)
    per = int(total_mb * 1e6 / files)
    paths = []
    for k in range(files):
        path = str(folder / f"part-{k}.tfrecord")
        writer = TFRecordWriter(path)
        written = 0
        while written < per:
            image = rng.integers(0, 255, int(rng.integers(1000, 6000)), np.uint8).tobytes()
            writer.write({"image": (image, "byte"), "label": (int(rng.integers(10)), "int")})
            written += len(image) + 40
        writer.close()
        paths.append(path)
    return paths


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--part", choices=("all", "loading", "indexing"), default="all")
    parser.add_argument("--ray", action="store_true", help="time executor='ray' as well")
    parser.add_argument("--big", action="store_true", help="index tar-64 (~1 GB) as well")
    parser.add_argument("--sets", default=None, help="indexing: these sets only (comma-separated)")


def main() -> None:
    use_cpu_devices()
    args = arguments(__doc__, seconds=3.0, rounds=5, add=_flags)
    n, shards, mb = (1024, 2, 2.0) if args.smoke else (20_000, 8, 100.0)
    scratch = Path(tempfile.mkdtemp(prefix="meshfeed-formats-bench-"))
    try:
        _run(args, scratch, n, shards, mb)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run(args: argparse.Namespace, scratch: Path, n: int, shards: int, mb: float) -> None:
    (scratch / "wds").mkdir()
    paths = write_shards(scratch / "wds", n, shards)
    if args.part in ("all", "loading"):
        _loading(args, paths)
    if args.part in ("all", "indexing"):
        (scratch / "wds16").mkdir()
        sets = {"tar": paths, "tar-16": write_shards(scratch / "wds16", 2 * n, 2 * shards)}
        (scratch / "jsonl").mkdir()
        (scratch / "tfrecord").mkdir()
        sets["jsonl"] = write_jsonl(scratch / "jsonl", mb)
        sets["tfrecord"] = write_tfrecords(scratch / "tfrecord", mb)
        if args.big:
            (scratch / "wds64").mkdir()
            sets["tar-64"] = write_shards(scratch / "wds64", 8 * n, 64)
        if args.sets:
            sets = {k: v for k, v in sets.items() if k in args.sets.split(",")}
        _indexing(args, sets, scratch)


def _loading(args: argparse.Namespace, paths: list[str]) -> None:
    entries = {"meshfeed": _meshfeed(paths), "webdataset": _webdataset(paths)}
    timed = {name: lambda e=e: measure(e, BATCH, args.seconds) for name, e in entries.items()}
    per_round = in_rounds(timed, args.rounds, pause=0.0)
    for name in entries:
        emit(
            "formats",
            smoke=args.smoke,
            workload="W",
            part="loading",
            name=name,
            rounds=args.rounds,
            samples_per_s=round(median_of(per_round, name) or 0),
            ratio_to_webdataset=median_ratio(per_round, name, "webdataset"),
        )


def _indexing(args: argparse.Namespace, sets: dict[str, list[str]], scratch: Path) -> None:
    contenders = ["read", "local"] + (["ray"] if args.ray else [])
    if args.ray:
        import ray

        ray.init(
            address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False
        )
        (scratch / "warm").mkdir()
        warm = write_jsonl(scratch / "warm", 0.01, files=2 * (os.cpu_count() or 1))
        meshfeed.index(warm, executor="ray", progress=False)  # its workers started
    for kind, files in sets.items():
        size = sum(os.path.getsize(p) for p in files)
        per_sample: dict[str, int] = {}  # index bytes per sample, by executor
        entries: dict[str, Callable[[], float]] = {"read": partial(_read_once, files)}
        for what in contenders[1:]:
            entries[what] = partial(_index_once, files, what, per_sample)
        per_round = in_rounds(entries, args.rounds, pause=0.0)
        read = statistics.median(size / r["read"] / 1e6 for r in per_round)
        for what in contenders[1:]:
            rate = statistics.median(size / r[what] / 1e6 for r in per_round)
            emit(
                "formats",
                smoke=args.smoke,
                workload="W",
                part="indexing",
                name=kind,
                executor=what,
                files=len(files),
                mb=round(size / 1e6, 1),
                rounds=args.rounds,
                index_mb_per_s=round(rate),
                read_mb_per_s=round(read),
                ratio_to_read=median_ratio(per_round, "read", what),
                index_bytes_per_sample=per_sample[what],
            )
    if args.ray:
        ray.shutdown()  # pyright: ignore[reportPossiblyUnboundVariable]


if __name__ == "__main__":
    main()
