"""Workload K, pod scale: the requests to open files from the store; 128 open files against all."""

from __future__ import annotations

import argparse
import io
import itertools
import os
import resource
import tarfile
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from harness import arguments, emit, in_rounds, median_ratio
from remote_fns import figures, in_child, loader, s3_store
from workload_fns import images

import meshfeed
from common import measure

KINDS = ("folder", "tar", "parquet")
HEAD = {"workload": "K", "devices": 8, "processes": 1}  # the children's: 8 devices, 1 process
COUNTS = [8, 64, 512, 2048, 10000]
BEFORE_MAX = 2048  # the most files the build before opens (~6 requests a file)
LIMITS = {"bounded": 128, "unbounded": 100_000}  # files open at most


def _open(kind: str, url: str, options: dict[str, Any]) -> dict[str, float]:
    """Seconds to open ``url``'s files of ``kind``, in a fresh process (imports included)."""
    start = time.perf_counter()
    if kind == "folder":
        meshfeed.open_source(url, storage_options=options)
    elif kind == "tar":
        meshfeed.sources.TarSource(url + "/*.tar", storage_options=options)
    else:
        try:
            meshfeed.sources.ParquetSource(url + "/*.parquet", storage_options=options)
        except FileNotFoundError:  # the build before: one file a source, each opened
            import s3fs

            files = s3fs.S3FileSystem(**options).glob(url.split("://", 1)[1] + "/*.parquet")
            for f in sorted(files):
                meshfeed.sources.ParquetSource("s3://" + f, storage_options=options)
    return {"seconds": time.perf_counter() - start}


def _read(path: str, limit: int, seconds: float) -> dict[str, Any]:
    """Steps/s of a global shuffle over ``path`` with at most ``limit`` files open; files held."""
    if limit > 128:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    fed = loader(meshfeed.open_source(path, max_open_files=limit), 512, shuffle=True, prefetch=0)
    rate = measure(lambda: iter(fed), 1, seconds, warmup=10)
    fds = len(os.listdir("/proc/self/fd"))
    line = {"steps_per_s": rate, "fds": fds, "held": fed.stats()["source"]["files"]["held"]}
    fed.close()  # its reader threads stopped before the interpreter ends
    return line


def _write(kind: str, n: int, folder: Path) -> Path:
    """``n`` files of ``kind``, two rows each (a folder: ``n`` shards of each field)."""
    if kind == "folder":
        data = {"x": np.arange(2 * n, dtype=np.int32), "y": np.ones((2 * n, 3), np.float32)}
        meshfeed.write_source(folder / "d", data, shard_size=2)
        return folder / "d"
    import pyarrow as pa  # not in the children before they open (their imports are timed)
    import pyarrow.parquet as pq

    out = folder / kind
    out.mkdir()
    for f in range(n):
        if kind == "parquet":
            pq.write_table(pa.table({"x": np.arange(2 * f, 2 * f + 2)}), out / f"t-{f:05d}.parquet")
        else:
            with tarfile.open(out / f"shard-{f:05d}.tar", "w") as tar:
                for i in (2 * f, 2 * f + 1):
                    for ext, data in (("txt", (b"sample %d " % i) * 4), ("cls", b"%d" % (i % 10))):
                        info = tarfile.TarInfo(f"{i:06d}.{ext}")
                        info.size = len(data)
                        tar.addfile(info, io.BytesIO(data))
    meshfeed.index(str(out / f"*.{kind}"), progress=False)
    return out


def startup(counts: list[int], src: str | None, smoke: bool) -> None:
    import s3fs  # not in the children before they open (their imports are timed)

    os.environ.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test")  # the children's
    every = {"after": None, **({"before": src} if src else {})}
    with s3_store() as (server, proxy, held):
        fs = s3fs.S3FileSystem(**server.storage_options)

        def opened(kind: str, url: str, src: str | None) -> dict[str, Any]:
            proxy.reset()
            return {**in_child(_open, kind, url, held, src=src), **proxy.counts()}

        for kind, n in itertools.product(KINDS, counts):
            url = f"s3://data/{kind}-{n}"
            with tempfile.TemporaryDirectory() as tmp:
                fs.put(str(_write(kind, n, Path(tmp))), url, recursive=True)
            rounds = 1 if smoke or n >= 512 else 3
            builds = every if n <= BEFORE_MAX else {"after": None}
            entries = {b: partial(opened, kind, url, p) for b, p in builds.items()}
            per_round = in_rounds(entries, rounds, pause=0.0)
            for b in entries:
                line = {"source": kind, "files": n, "build": b, "rounds": rounds}
                line |= {k: v for k, v in per_round[0][b].items() if k != "seconds"}
                line |= figures(per_round, b, {"seconds": 3})
                line["requests_per_file"] = round(line["total"] / n, 3)
                emit("startup", **HEAD, smoke=smoke, part="startup", **line)


def cache(smoke: bool, rounds: int, seconds: float, shards: int, per_shard: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        rows = per_shard * shards
        data = {**images(rows), "label": np.arange(rows, dtype=np.int32)}
        path = str(Path(tmp) / "d")
        meshfeed.write_source(path, data, shard_size=per_shard)
        entries = {k: partial(in_child, _read, path, n, seconds) for k, n in LIMITS.items()}
        per_round = in_rounds(entries, rounds, pause=0.0)
    shape = {"files": 2 * shards, "rows_a_shard": per_shard, "rounds": rounds}
    for name in LIMITS:
        line = {"name": name, **shape, **{k: per_round[-1][name][k] for k in ("fds", "held")}}
        line |= figures(per_round, name, {"steps_per_s": 2})
        if name == "bounded":
            line["ratio_to_unbounded"] = median_ratio(per_round, name, "unbounded", "steps_per_s")
        emit("startup", **HEAD, smoke=smoke, part="cache", **line)


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--src", help="also time the meshfeed in this folder (before)")
    parser.add_argument("--part", choices=["startup", "cache", "both"], default="both")


def main() -> None:
    args = arguments(__doc__, seconds=3.0, rounds=7, add=_flags)
    if args.part in ("startup", "both"):
        startup([8] if args.smoke else COUNTS, args.src, args.smoke)
    if args.part in ("cache", "both"):
        # 128 files; 4,096 files; 4,096 files of 96 KiB images
        sizes = [(256, 2)] if args.smoke else [(64, 32), (2048, 2), (2048, 32)]
        for shards, per_shard in sizes:
            cache(args.smoke, args.rounds, args.seconds, shards, per_shard)


if __name__ == "__main__":
    main()
