"""Pod scale: what one host asks of the store to start, against the file count; the
bounded pool of open files against none.

Workload K, on an S3 server on 127.0.0.1 (moto) behind a ``CountingProxy`` that counts
every request it forwards:

- ``folder``: a meshfeed folder of N shards x 2 fields (int32 and float32[3], 2 rows a
  shard), written by ``write_source`` and uploaded;
- ``tar``: N WebDataset shards of 2 samples (a text and a class), indexed by
  ``meshfeed.index`` (which writes their catalog) and uploaded;
- ``parquet``: N Parquet files of 2 rows, catalogued by ``meshfeed index`` and uploaded
  (the build before took one file per ``ParquetSource``: it opens them one by one).

For N in 8 .. 10^4, a fresh process per build opens the data and exits: the requests the
proxy saw (by kind) and the seconds of the open. ``--src`` times the build in that folder
too (``before``; ``git worktree add``), in rotating rounds (one round from 512 files,
where the requests do not vary; none past ``--before-max``, 2,048 by default: the build
before sends ~6 requests a file, one after another, ~35 ms each on the local server).

``cache``: a local folder of 64 shards of 32 rows, then 2,048 of 2 rows, of 2 fields
(32x32x3 uint8 images and labels), read with a global shuffle, batch 512 on 8 CPU devices, in fresh
processes: the default pool of 128 open files against one of 100,000 (the soft limit
raised), steps/s in rotating rounds; goal >= 0.95x. Read in the loop (``prefetch=0``):
on rows this small the read-ahead's thread swings steps/s by +-25% from one process to
the next, more than the pool costs. 64 shards are 128 files, within the
bound; 2,048 are 4,096, and a step reads ~970 of them, so with 128 open nearly every
read would open its file and close another: these files are small (6 KiB), so past the
bound they are held whole by their bytes instead. Last, 2,048 shards of 32 rows: 4,096
files again, their images 96 KiB each, over what is held (64 KiB), so nearly every
image read opens its file: the worst case there is.

Prints one JSON line per measurement; ``--smoke`` for CI.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
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
    out = subprocess.run(
        [sys.executable, "-c", OPEN, kind, url, proxy.endpoint],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    if out.returncode:
        sys.exit(f"{kind} {url} did not open:\n{out.stderr[-2000:]}")
    return {**proxy.counts(), **json.loads(out.stdout.strip().splitlines()[-1])}


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
                seen: dict[str, list[dict[str, Any]]] = {b: [] for b in builds}
                names = list(builds)
                for r in range(rounds):
                    for b in names[r % len(names) :] + names[: r % len(names)]:
                        seen[b].append(_open(kind, url, proxy, builds[b]))
                for b, runs in seen.items():
                    line = {k: v for k, v in runs[0].items() if k != "seconds"}
                    line["seconds"] = round(statistics.median(r["seconds"] for r in runs), 3)
                    _print(part="startup", source=kind, files=n, build=b, rounds=rounds,
                           requests_per_file=round(line["total"] / n, 3), **line)  # fmt: skip
    finally:
        proxy.close()
        server.close()


def cache(rounds: int, seconds: float, shards: int, per_shard: int, prefetch: str = "0") -> None:
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
        rates: dict[str, list[float]] = {k: [] for k in limits}
        fds: dict[str, int] = {}
        held: dict[str, int] = {}
        names = list(limits)
        for r in range(rounds):
            for name in names[r % 2 :] + names[: r % 2]:
                out = subprocess.run(
                    [sys.executable, "-c", READ, str(Path(tmp) / "d"), str(limits[name]),
                     str(seconds), prefetch],
                    capture_output=True, text=True, check=False,
                )  # fmt: skip
                if out.returncode:
                    sys.exit(out.stderr[-2000:])
                got = json.loads(out.stdout.strip().splitlines()[-1])
                rates[name].append(got["steps_per_s"])
                fds[name], held[name] = got["fds"], got["held"]
        ratio = statistics.median(
            a / b for a, b in zip(rates["bounded"], rates["unbounded"], strict=True)
        )
        for name in names:
            extra = {"ratio_to_unbounded": round(ratio, 3)} if name == "bounded" else {}
            rate = round(statistics.median(rates[name]), 2)
            _print(part="cache", name=name, files=2 * shards, rows_a_shard=per_shard,
                   rounds=rounds, fds=fds[name], held=held[name], steps_per_s=rate,
                   **extra)  # fmt: skip


def _print(**line: Any) -> None:
    from importlib.metadata import version

    line = {"benchmark": "startup", "workload": "K", **line}
    line.update(jax=version("jax"), python=platform.python_version())
    print(json.dumps(line), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny data, for CI")
    parser.add_argument("--src", help="also time the meshfeed in this folder (before)")
    parser.add_argument("--counts", default="8,64,512,2048,10000", help="files, comma-separated")
    parser.add_argument(
        "--before-max",
        type=int,
        default=2048,
        help="the most files the build before opens (~6 requests a file)",
    )
    parser.add_argument("--part", choices=["startup", "cache", "both"], default="both")
    parser.add_argument("--rounds", type=int, default=7, help="cache: rotating rounds")
    args = parser.parse_args()
    counts = [8] if args.smoke else [int(c) for c in args.counts.split(",")]
    if args.part in ("startup", "both"):
        startup(counts, args.src, args.smoke, args.before_max)
    if args.part in ("cache", "both"):
        if args.smoke:
            cache(rounds=1, seconds=0.3, shards=256, per_shard=2)
        else:
            cache(rounds=args.rounds, seconds=3.0, shards=64, per_shard=32)  # 128 files
            cache(rounds=args.rounds, seconds=3.0, shards=2048, per_shard=2)  # 4,096 files
            cache(rounds=args.rounds, seconds=3.0, shards=2048, per_shard=32)  # 96 KiB images


if __name__ == "__main__":
    main()
