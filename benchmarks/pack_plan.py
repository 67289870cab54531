"""Workload W, a packed corpus at start-up: the packing plan kept as data against planning it."""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import arguments, emit, in_rounds, median_of, run_child

SEQ_LEN = 2048
ENTRIES = ("unpacked", "kept", "planned")


def write_documents(folder: Path, n: int) -> Path:
    """``n`` documents of log-normal lengths (mean ~33), zeros, as a meshfeed folder."""
    import numpy as np

    import meshfeed

    lengths = np.maximum(1, np.random.default_rng(0).lognormal(3.0, 0.9, n)).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = meshfeed.Ragged(np.zeros(int(offsets[-1]), np.uint16), offsets)
    meshfeed.write_source(folder, {"tokens": tokens}, shard_size=1 << 20)
    return folder


def _child(entry: str, data: str) -> None:
    """One entry in this fresh process: its seconds to a first batch, its peak RSS."""
    import jax
    import numpy as np

    import meshfeed

    jax.devices()
    start = time.perf_counter()
    source = meshfeed.open_source(data)
    if entry == "unpacked":
        source[np.arange(16)]
        rows = len(source)
    else:
        packed = meshfeed.pack(source, SEQ_LEN, plan_dir=None if entry == "kept" else False)
        sharding = meshfeed.batch_sharding(meshfeed.make_mesh(data=1))
        loader = meshfeed.Loader(packed, global_batch_size=16, sharding=sharding, prefetch=0)
        next(iter(loader))
        rows = len(packed)
    seconds = time.perf_counter() - start
    try:  # VmHWM starts over at exec, where ru_maxrss keeps the forking parent's
        with open("/proc/self/status") as f:
            rss = next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmHWM:"))
    except (OSError, StopIteration):  # off Linux
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"seconds": seconds, "peak_rss": rss, "rows": rows}))


def build_rates(data: Path, n: int, ray: bool = False) -> dict:
    """Documents/s of the kept plan's build on 1 and 2 worker processes (and Ray tasks),
    and of the in-memory planner; the same plan."""
    import meshfeed

    source = meshfeed.open_source(data)
    start = time.perf_counter()
    memory = meshfeed.pack(source, SEQ_LEN, plan_dir=False)
    planned = time.perf_counter() - start
    out: dict[str, float] = {"planner_docs_per_s": round(n / planned)}

    def build(name: str, **how: Any) -> None:
        start = time.perf_counter()
        kept = meshfeed.pack(source, SEQ_LEN, rebuild_plan=True, **how)
        built = time.perf_counter() - start
        if kept.fingerprint != memory.fingerprint:
            raise RuntimeError("the kept plan differs from the one made in memory")
        out[f"build_{name}_docs_per_s"] = round(n / built)
        out[f"build_{name}_over_planner"] = round(planned / built, 3)

    build("1", plan_workers=1)
    build("2", plan_workers=2)
    if ray:
        import ray as ray_module

        ray_module.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        build("ray", plan_executor="ray")
        ray_module.shutdown()
    return out


def local(sizes: list[int], rounds: int, smoke: bool, ray: bool = False) -> None:
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="meshfeed-pack-plan-") as scratch:
            data = write_documents(Path(scratch) / "data", n)
            rates = build_rates(data, n, ray)
            emit("pack_plan", smoke=smoke, workload="W", part="build", documents=n, **rates)
            child = [__file__, "--data", str(data), "--run"]
            entries = {e: functools.partial(run_child, [*child, e]) for e in ENTRIES}
            per_round = in_rounds(entries, rounds)
        line = {"workload": "W", "part": "start-up", "documents": n, "rounds": rounds}
        for e in ENTRIES:
            line[f"{e}_s"] = round(median_of(per_round, e, "seconds") or 0.0, 3)
            line[f"{e}_rss_mb"] = round((median_of(per_round, e, "peak_rss") or 0.0) / 2**20, 1)
        line["kept_over_unpacked_s"] = round(line["kept_s"] - line["unpacked_s"], 3)
        line["kept_over_unpacked_mb"] = round(line["kept_rss_mb"] - line["unpacked_rss_mb"], 1)
        emit("pack_plan", smoke=smoke, **line)


def s3(sizes: list[int], smoke: bool) -> None:
    import s3fs
    from remote_fns import s3_store

    import meshfeed

    with s3_store() as (server, proxy, counted):
        direct = server.storage_options
        for n in sizes:
            url = f"s3://data/packed-{n}"
            with tempfile.TemporaryDirectory() as tmp:
                data = str(write_documents(Path(tmp) / "data", n))
                s3fs.S3FileSystem(**direct).put(data, url, recursive=True)
            meshfeed.pack(meshfeed.open_source(url, storage_options=direct), SEQ_LEN)
            proxy.reset()
            packed = meshfeed.pack(meshfeed.open_source(url, storage_options=counted), SEQ_LEN)
            counts = proxy.counts()
            line: dict[str, Any] = {"workload": "W", "part": "s3-open", "documents": n}
            line |= {"requests": counts["total"], "head": counts["head"], "rows": len(packed)}
            emit("pack_plan", smoke=smoke, **line)


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 4_000_000, 16_000_000])
    parser.add_argument("--s3", action="store_true", help="the S3 requests part only")
    parser.add_argument("--ray", action="store_true", help="time the build on Ray tasks too")
    parser.add_argument("--run", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--data", default=None, help=argparse.SUPPRESS)


def main() -> None:
    args = arguments(__doc__, rounds=3, smoke={"rounds": 1, "sizes": [20_000]}, add=_flags)
    if args.run:
        _child(args.run, args.data)
        return
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if not args.s3:
        local(args.sizes, args.rounds, args.smoke, args.ray)
    if args.s3 or args.smoke:
        s3([10_000] if args.smoke else [100_000, 1_000_000], args.smoke)


if __name__ == "__main__":
    main()
