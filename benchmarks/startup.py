"""Pod scale: what one host asks of the store to start, against the file count; the
bounded pool of open files against none.

Workload K: a folder, tar shards and Parquet files on moto's S3 server behind a
``CountingProxy``, each opened by a fresh process (``--src``: the build before too); then
the default pool of 128 open files against 100,000, steps/s (goal >= 0.95x). ``--smoke``
for CI; the workload is in ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import io
import os
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from harness import arguments, emit, in_rounds, median_of, median_ratio, run_child

KINDS = ("folder", "tar", "parquet")

OPEN = """
import json, sys, time
kind, url, endpoint = sys.argv[1:4]
import meshfeed
options = {"endpoint_url": endpoint, "key": "test", "secret": "test",
           "client_kwargs": {"region_name": "us-east-1"}}
start = time.perf_counter()
if kind == "folder":
    source = meshfeed.open_source(url, storage_options=options)
elif kind == "tar":
    source = meshfeed.sources.TarSource(url + "/*.tar", storage_options=options)
else:
    try:
        source = meshfeed.sources.ParquetSource(url + "/*.parquet", storage_options=options)
    except FileNotFoundError:  # the build before: one file a source, each opened
        import s3fs
        fs = s3fs.S3FileSystem(**options)
        files = sorted(fs.glob(url.split("://", 1)[1] + "/*.parquet"))
        source = [
            meshfeed.sources.ParquetSource("s3://" + f, storage_options=options) for f in files
        ]
print(json.dumps({"seconds": time.perf_counter() - start}))
"""

READ = """
import hashlib, json, os, resource, sys, time
path, limit, prefetch = sys.argv[1], int(sys.argv[2]), sys.argv[4]
if limit > 128:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax, meshfeed
source = meshfeed.open_source(path, max_open_files=limit)
loader = meshfeed.Loader(source, global_batch_size=512, num_epochs=None, shuffle=True,
                         sharding=meshfeed.batch_sharding(meshfeed.make_mesh(data=8)),
                         prefetch=int(prefetch) if prefetch.isdigit() else prefetch)
it = iter(loader)
for _ in range(10):
    jax.block_until_ready(next(it))
steps, start = 0, time.perf_counter()
while time.perf_counter() - start < float(sys.argv[3]):
    jax.block_until_ready(next(it))
    steps += 1
print(json.dumps({"steps_per_s": steps / (time.perf_counter() - start),
                  "fds": len(os.listdir("/proc/self/fd")),
                  "held": loader.stats()["source"]["files"]["held"]}))
loader.close()  # its reader threads stopped before the interpreter ends
"""


def _payload(i: int) -> bytes:
    return f"sample {i} ".encode() * 4


def _write(kind: str, n: int, folder: Path) -> Path:
    import meshfeed

    if kind == "folder":
        rows = 2 * n
        data = {"x": np.arange(rows, dtype=np.int32), "y": np.ones((rows, 3), np.float32)}
        meshfeed.write_source(folder / "d", data, shard_size=2)
        return folder / "d"
    out = folder / kind
    out.mkdir()
    if kind == "tar":
        for s in range(n):
            with tarfile.open(out / f"shard-{s:05d}.tar", "w") as tar:
                for i in (2 * s, 2 * s + 1):
                    for ext, data in (("txt", _payload(i)), ("cls", str(i % 10).encode())):
                        info = tarfile.TarInfo(f"{i:06d}.{ext}")
                        info.size = len(data)
                        tar.addfile(info, io.BytesIO(data))
        meshfeed.index(str(out / "*.tar"), progress=False)
        return out
    import pyarrow as pa
    import pyarrow.parquet as pq

    for f in range(n):
        pq.write_table(pa.table({"x": np.arange(2 * f, 2 * f + 2)}), out / f"t-{f:05d}.parquet")
    meshfeed.index(str(out / "*.parquet"), progress=False)
    return out


def _open(kind: str, url: str, proxy: Any, src: str | None) -> dict[str, Any]:
    env = dict(os.environ, AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test")
    if src:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    proxy.reset()
    opened = run_child(["-c", OPEN, kind, url, proxy.endpoint], env=env)
    return {**proxy.counts(), **opened}


def startup(counts: list[int], src: str | None, smoke: bool, before_max: int) -> None:
    import s3fs

    from meshfeed.testing import CountingProxy, S3Server

    server = S3Server()
    server.make_bucket("data")
    proxy = CountingProxy(server.port)
    fs = s3fs.S3FileSystem(**server.storage_options)
    every = {"after": None, **({"before": src} if src else {})}
    try:
        for kind in KINDS:
            for n in counts:
                with tempfile.TemporaryDirectory() as tmp:
                    local = _write(kind, n, Path(tmp))
                    url = f"s3://data/{kind}-{n}"
                    fs.put(str(local), url, recursive=True)
                rounds = 1 if smoke or n >= 512 else 3
                builds = {b: p for b, p in every.items() if b == "after" or n <= before_max}
                entries = {
                    b: lambda p=p, u=url, k=kind: _open(k, u, proxy, p) for b, p in builds.items()
                }
                per_round = in_rounds(entries, rounds, pause=0.0)
                for b in builds:
                    line = {"source": kind, "files": n, "build": b, "rounds": rounds}
                    line |= {k: v for k, v in per_round[0][b].items() if k != "seconds"}
                    line["seconds"] = round(median_of(per_round, b, "seconds") or 0.0, 3)
                    line["requests_per_file"] = round(line["total"] / n, 3)
                    _print(smoke=smoke, part="startup", **line)
    finally:
        proxy.close()
        server.close()


def cache(
    smoke: bool, rounds: int, seconds: float, shards: int, per_shard: int, prefetch: str = "0"
) -> None:
    import meshfeed

    with tempfile.TemporaryDirectory() as tmp:
        rows = per_shard * shards
        rng = np.random.default_rng(0)
        data = {
            "image": rng.integers(0, 256, (rows, 32, 32, 3), dtype=np.uint8),
            "label": np.arange(rows, dtype=np.int32),
        }
        meshfeed.write_source(Path(tmp) / "d", data, shard_size=per_shard)
        limits = {"bounded": 128, "unbounded": 100_000}
        command = ["-c", READ, str(Path(tmp) / "d")]
        entries = {
            name: lambda n=n: run_child([*command, str(n), str(seconds), prefetch])
            for name, n in limits.items()
        }
        per_round = in_rounds(entries, rounds, pause=0.0)
        ratio = median_ratio(per_round, "bounded", "unbounded", "steps_per_s")
        for name in limits:
            extra = {"ratio_to_unbounded": ratio} if name == "bounded" else {}
            _print(
                smoke=smoke,
                part="cache",
                name=name,
                files=2 * shards,
                rows_a_shard=per_shard,
                rounds=rounds,
                fds=per_round[-1][name]["fds"],
                held=per_round[-1][name]["held"],
                steps_per_s=round(median_of(per_round, name, "steps_per_s") or 0.0, 2),
                **extra,
            )


def _print(**line: Any) -> None:
    # The children have 8 devices, one process each.
    emit("startup", workload="K", devices=8, processes=1, **line)


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--src", help="also time the meshfeed in this folder (before)")
    parser.add_argument("--counts", default="8,64,512,2048,10000", help="files, comma-separated")
    parser.add_argument(
        "--before-max",
        type=int,
        default=2048,
        help="the most files the build before opens (~6 requests a file)",
    )
    parser.add_argument("--part", choices=["startup", "cache", "both"], default="both")


def main() -> None:
    args = arguments(__doc__, rounds=7, smoke={}, add=_flags)
    counts = [8] if args.smoke else [int(c) for c in args.counts.split(",")]
    if args.part in ("startup", "both"):
        startup(counts, args.src, args.smoke, args.before_max)
    if args.part in ("cache", "both") and args.smoke:
        cache(True, rounds=1, seconds=0.3, shards=256, per_shard=2)
    elif args.part in ("cache", "both"):
        # 128 files; 4,096 files; 4,096 files of 96 KiB images
        for shards, per_shard in ((64, 32), (2048, 2), (2048, 32)):
            cache(False, args.rounds, seconds=3.0, shards=shards, per_shard=per_shard)


if __name__ == "__main__":
    main()
