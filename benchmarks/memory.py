"""Workload D, memory: the peak RSS of a fresh process (8 CPU devices) over one shuffled epoch
of a 4 GiB memmapped ``.npy`` (``--smoke``: 64 MiB), with ``pread`` reads and through the
mapping, written under ``TMPDIR``. Goal: <= 1.5 GiB by default.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
from harness import arguments, emit, run_child, use_cpu_devices

WIDTH = 4096  # uint32 per row: 16 KiB rows
BATCH = 256

MEASURE = """
import json, resource, sys, time
import jax, numpy as np, meshfeed
path, pread = sys.argv[1], sys.argv[2] == "1"
source = meshfeed.ArraySource({"x": np.load(path, mmap_mode="r")}, pread=pread)
loader = meshfeed.Loader(source, global_batch_size=BATCH_SIZE,
                         sharding=meshfeed.batch_sharding(meshfeed.make_mesh(data=8)))
start = time.perf_counter()
for batch in loader:
    jax.block_until_ready(batch)
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"peak": peak, "seconds": seconds, "steps": len(loader)}))
""".replace("BATCH_SIZE", str(BATCH))


def write_file(path: Path, rows: int) -> None:
    """Writes the .npy in 64 MiB chunks through a file object: nothing stays mapped."""
    header = {"descr": "<u4", "fortran_order": False, "shape": (rows, WIDTH)}
    chunk = (64 << 20) // (WIDTH * 4)
    with path.open("wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        for start in range(0, rows, chunk):
            ids = np.arange(start, min(start + chunk, rows), dtype=np.uint32)
            f.write(np.repeat(ids[:, None], WIDTH, axis=1).tobytes())


def main() -> None:
    args = arguments(__doc__)
    use_cpu_devices()  # in the processes that measure
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "data.npy"
        start = time.perf_counter()
        write_file(path, 4096 if args.smoke else 262_144)
        written = time.perf_counter() - start
        size = path.stat().st_size
        for name, pread in (("pread (default)", "1"), ("through the mapping", "0")):
            got = run_child(["-c", MEASURE, str(path), pread])
            emit(
                "memory",
                smoke=args.smoke,
                workload="D",
                name=name,
                file_bytes=size,
                file_gib=round(size / 2**30, 3),
                peak_rss_bytes=got["peak"],
                peak_rss_gib=round(got["peak"] / 2**30, 3),
                rss_to_file=round(got["peak"] / size, 3),
                epoch_seconds=round(got["seconds"], 2),
                samples_per_s=round(got["steps"] * BATCH / got["seconds"]),
                steps=got["steps"],
                write_seconds=round(written, 1),
                devices=8,
                processes=1,
            )


if __name__ == "__main__":
    main()
