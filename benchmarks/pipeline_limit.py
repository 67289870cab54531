"""The record pipeline against the machine's limit, and the loader's own cost (workload C)."""

from __future__ import annotations

from typing import Any

import numpy as np
from decode_fns import CROP, decode_loop, encode_all, identity
from decode_throughput import BATCH, SMOKE, DecodedImages, loops_rate, meshfeed_run
from gpu_host import timed
from harness import arguments, emit, in_rounds, median_of, median_ratio, use_cpu_devices

from common import Run, torch_batches

# meshfeed's record loop (private: no public name runs it without a Loader) on chunks of 128.
_RECORD_LOOP = """
import sys, time
sys.path.insert(0, {here!r})
import numpy as np
from decode_fns import CROP, decode_crop, encode_all
from meshfeed.workers._record_rows import transform_rows
encoded, labels = encode_all({n})
ids = np.arange(len(labels))
out = {{"image": np.zeros((128, CROP, CROP, 3), np.uint8), "label": np.zeros(128, np.int32)}}
current = np.zeros(1, np.int64)
print("ready", flush=True)
sys.stdin.readline()
done, start = 0, time.perf_counter()
while time.perf_counter() - start < {seconds}:
    for lo in range(0, len(labels), 128):
        rows = slice(lo, lo + 128)
        part = {{"png": encoded[rows], "label": labels[rows]}}
        transform_rows(decode_crop, part, ids[rows], out, 0, 0, 0, current)
    done += len(labels)
print(done / (time.perf_counter() - start), flush=True)
"""


def _timed(run: Run, seconds: float) -> dict[str, float]:
    """Records/s of ``run()`` in steady state, and the CPU the loading process and its
    children spent per batch and per record meanwhile; the loader closed on return."""
    got = timed(run(), seconds)
    return {
        "rate": got["steps_per_s"] * BATCH,
        "loader_cpu_ms_per_batch": got["cpu_ms_per_step"],
        "worker_cpu_us_per_record": 1e3 * got["children_ms"] / BATCH,
    }


def _flags(parser: Any) -> None:
    parser.add_argument("--examples", type=int, default=30_000)
    parser.add_argument("--label", default="", help="a tag for this run (e.g. before/after)")


def main() -> None:
    use_cpu_devices()
    args = arguments(__doc__, seconds=2.0, rounds=7, smoke=SMOKE, add=_flags)
    seconds = args.seconds
    encoded, labels = encode_all(args.examples)
    pngs = {"png": encoded, "label": labels}
    image = np.random.default_rng(0).integers(0, 255, (args.examples, CROP, CROP, 3), np.uint8)
    loaders = {
        "torch:2": torch_batches(DecodedImages(pngs), BATCH, workers=2),
        "meshfeed:2": meshfeed_run(pngs, 2),
        "meshfeed-threads:2": meshfeed_run(pngs, 2, "threads"),
        "identity:2": meshfeed_run({"image": image, "label": labels}, 2, fn=identity),
    }
    entries: dict[str, Any] = {
        "limit": lambda: {"rate": loops_rate(2, seconds)},
        "loop": lambda: {"rate": decode_loop(encoded, labels, seconds)},
        "record-loop:2": lambda: {"rate": loops_rate(2, seconds, loop=_RECORD_LOOP)},
    }
    for name, run in loaders.items():  # a reason a peer is skipped stays as it is
        entries[name] = run if isinstance(run, str) else lambda run=run: _timed(run, seconds)
    per_round = in_rounds(entries, args.rounds)
    common = {"label": args.label, "global_batch_size": BATCH, "examples": args.examples}
    common |= {"rounds": args.rounds, "window_s": seconds}
    for name, entry in entries.items():
        line: dict[str, Any] = {"workload": "C", "name": name, **common}
        if isinstance(entry, str):
            emit("pipeline_limit", smoke=args.smoke, **line, skipped=entry)
            continue
        line["records_per_s"] = round(median_of(per_round, name, "rate") or 0.0)
        bases = {} if name == "identity:2" else {"ratio_to_limit": "limit"}
        if name.startswith("meshfeed"):
            bases |= {"ratio_to_record_loop": "record-loop:2", "ratio_to_torch": "torch:2"}
        ratios = {key: median_ratio(per_round, name, base, "rate") for key, base in bases.items()}
        line |= {key: ratio for key, ratio in ratios.items() if ratio is not None}
        for key in ("loader_cpu_ms_per_batch", "worker_cpu_us_per_record"):
            if key in per_round[0][name]:
                line[key] = round(median_of(per_round, name, key) or 0.0, 3)
        emit("pipeline_limit", smoke=args.smoke, **line)


if __name__ == "__main__":
    main()
