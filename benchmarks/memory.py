"""Workload D, memory: one epoch over a 4 GiB memmapped source; peak resident memory.

A fresh process (8 CPU devices) feeds every row of a 262144 x 4096 uint32 ``.npy`` file
opened with ``np.load(mmap_mode="r")`` once through a shuffled ``Loader`` (batch 256)
and reports its peak RSS (JAX included), with the default ``pread`` reads and with a
gather through the mapping. Goal: peak RSS <= 1.5 GiB by default. ``--smoke``: 64 MiB.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import arguments, emit, use_cpu_devices

WIDTH = 4096  # uint32 per row: 16 KiB rows
BATCH = 256

MEASURE = """
import resource, sys, time
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
    args = arguments(
        __doc__,
        add=lambda p: p.add_argument("--dir", help="where to write the file (default: temp)"),
    )
    use_cpu_devices()  # in the processes that measure
    rows = 4096 if args.smoke else 262_144
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "data.npy"
        start = time.perf_counter()
        write_file(path, rows)
        written = time.perf_counter() - start
        size = path.stat().st_size
        for name, pread in (("pread (default)", "1"), ("through the mapping", "0")):
            command = [sys.executable, "-c", MEASURE, str(path), pread]
            out = subprocess.check_output(command, text=True).split()
            peak = int(out[0])
            seconds = float(out[1])
            steps = int(out[2])
            emit(
                "memory",
                smoke=args.smoke,
                workload="D",
                name=name,
                file_bytes=size,
                file_gib=round(size / 2**30, 3),
                peak_rss_bytes=peak,
                peak_rss_gib=round(peak / 2**30, 3),
                rss_to_file=round(peak / size, 3),
                epoch_seconds=round(seconds, 2),
                samples_per_s=round(steps * BATCH / seconds),
                steps=steps,
                write_seconds=round(written, 1),
                devices=8,
                processes=1,
            )


if __name__ == "__main__":
    main()
