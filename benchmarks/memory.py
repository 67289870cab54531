"""Workload D, memory: one epoch over a 4 GiB memmapped source; peak resident memory.

The file (262144 rows x 4096 uint32, 4 GiB) is written in chunks by this script, then a
fresh process opens it with ``np.load(mmap_mode="r")``, feeds every row once through a
shuffled ``meshfeed.Loader`` (global batch 256, 8 CPU devices, default prefetch) and
reports its peak RSS (``ru_maxrss``), which includes JAX itself. For comparison the same
process shape runs a gather through the mapping (``ArraySource(pread=False)``), whose
touched pages stay resident.

Goal: peak RSS <= 1.5 GiB with the default reads. ``--smoke``: a 64 MiB file.
Prints one JSON line per measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

WIDTH = 4096  # uint32 per row: 16 KiB rows
BATCH = 256

MEASURE = """
import os, resource, sys, time
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax, numpy as np, meshfeed
path, pread = sys.argv[1], sys.argv[2] == "1"
source = meshfeed.ArraySource({"x": np.load(path, mmap_mode="r")}, pread=pread)
loader = meshfeed.Loader(source, global_batch_size=BATCH_SIZE,
                         sharding=meshfeed.batch_sharding(meshfeed.make_mesh(data=8)))
start = time.perf_counter()
for batch in loader:
    jax.block_until_ready(batch)
seconds = time.perf_counter() - start
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, seconds, len(loader))
""".replace("BATCH_SIZE", str(BATCH))


def write_file(path: Path, rows: int) -> None:
    """Writes the .npy in 64 MiB chunks through a file object: nothing stays mapped."""
    header = {"descr": "<u4", "fortran_order": False, "shape": (rows, WIDTH)}
    with path.open("wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        chunk = max(1, (64 << 20) // (WIDTH * 4))
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            block = np.broadcast_to(
                np.arange(start, start + n, dtype=np.uint32)[:, None], (n, WIDTH)
            )
            f.write(np.ascontiguousarray(block).tobytes())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a 64 MiB file, for CI")
    parser.add_argument("--dir", default=None, help="where to write the file (default: temp)")
    args = parser.parse_args()
    rows = 4096 if args.smoke else 262_144
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "data.npy"
        start = time.perf_counter()
        write_file(path, rows)
        written = time.perf_counter() - start
        size = path.stat().st_size
        for name, pread in (("pread (default)", "1"), ("through the mapping", "0")):
            env = {**os.environ, "JAX_PLATFORMS": "cpu"}
            out = subprocess.check_output(
                [sys.executable, "-c", MEASURE, str(path), pread], env=env, text=True
            ).split()
            peak, seconds, steps = int(out[0]), float(out[1]), int(out[2])
            print(
                json.dumps(
                    {
                        "benchmark": "memory",
                        "workload": "D",
                        "name": name,
                        "file_bytes": size,
                        "file_gib": round(size / 2**30, 3),
                        "peak_rss_bytes": peak,
                        "peak_rss_gib": round(peak / 2**30, 3),
                        "rss_to_file": round(peak / size, 3),
                        "epoch_seconds": round(seconds, 2),
                        "samples_per_s": round(steps * BATCH / seconds),
                        "steps": steps,
                        "write_seconds": round(written, 1),
                        "smoke": args.smoke,
                        "python": platform.python_version(),
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
