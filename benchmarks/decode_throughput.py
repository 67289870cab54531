"""Workload C, decode: PNG-encoded 32x32 RGB images decoded and randomly cropped per record.

A plain loop on one core (``loop``) and on two at once (``loop x2``) against
``Loader(record_transform=decode_crop, num_workers=W)`` (processes and threads), the
PyTorch ``DataLoader(num_workers=W)``, Grain ``mp_prefetch`` and tf.data when installed;
global batch 256 on 8 CPU devices, rotating rounds, medians of per-round ratios. Goal:
meshfeed with 2 workers >= 1.6x the loop and >= 1.1x the DataLoader. README.md says
more. ``--smoke`` for CI.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_fns import CROP, decode_crop, decode_crop_seeded, decode_loop, encode_all
from harness import arguments, emit, in_rounds, median_of, median_ratio, use_cpu_devices

import meshfeed
from common import (
    Records,
    Run,
    collate,
    loader_batches,
    loops_at_once,
    measure,
    not_installed,
    to_global,
    torch_batches,
)

BATCH = 256
SMOKE = {"seconds": 0.3, "rounds": 1, "examples": 2048}  # this and pipeline_limit.py

LOOP_SCRIPT = """
import sys
sys.path.insert(0, {here!r})
from decode_fns import decode_loop, encode_all
encoded, labels = encode_all({n})
print("ready", flush=True)
sys.stdin.readline()
print(decode_loop(encoded, labels, {seconds}), flush=True)
"""


def loops_rate(count: int, seconds: float, n: int = 2048, loop: str = LOOP_SCRIPT) -> float:
    """Records per second of ``count`` processes running a loop (by default the plain
    one) together: ``loop`` is a script that prints ``ready``, waits for a line, loops
    for ``{seconds}`` over ``encode_all({n})`` and prints its records per second."""
    script = loop.format(here=str(Path(__file__).parent), n=n, seconds=seconds)
    return loops_at_once(script, count)


def meshfeed_run(
    source: dict[str, np.ndarray],
    workers: int,
    worker_type: str = "processes",
    fn: Any = decode_crop,
) -> Run:
    """``Loader(record_transform=fn, num_workers=workers)`` over ``source``, endless."""
    return loader_batches(
        lambda: meshfeed.ArraySource(source),
        BATCH,
        record_transform=fn,
        num_workers=workers,
        worker_type=worker_type,
    )


class DecodedImages:
    """The PyTorch map-style dataset: decodes and crops image ``i`` with its own seed."""

    def __init__(self, encoded: np.ndarray, labels: np.ndarray) -> None:
        self.encoded = encoded
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return decode_crop_seeded(self.encoded[i], self.labels[i], i)


def torch_run(encoded: np.ndarray, labels: np.ndarray, workers: int) -> Run | str:
    return torch_batches(DecodedImages(encoded, labels), BATCH, workers=workers)


def _grain(encoded: np.ndarray, labels: np.ndarray, workers: int) -> Run | str:
    try:
        import grain
    except ImportError:
        return not_installed("grain")

    from absl import flags

    if not flags.FLAGS.is_parsed():  # grain's worker processes read absl flags
        flags.FLAGS.mark_as_parsed()

    def run() -> Any:
        ds = (
            grain.MapDataset.source(Records({"png": encoded, "label": labels}))
            .shuffle(seed=0)
            .random_map(decode_crop, seed=0)
            .batch(BATCH, drop_remainder=True, batch_fn=collate)
            .repeat()
            .to_iter_dataset()
        )
        if workers:
            ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
        yield from to_global(iter(ds), BATCH)

    return run


def _tfdata(encoded: np.ndarray, labels: np.ndarray, workers: int) -> Run | str:
    try:
        import tensorflow as tf  # type: ignore[import-not-found]
    except ImportError:
        return "tensorflow is not installed"

    def run() -> Any:
        ds = tf.data.Dataset.from_tensor_slices((list(encoded), labels)).shuffle(10_000, seed=0)

        def decode(png: Any, label: Any) -> Any:
            image = tf.io.decode_png(png, channels=3)
            return {"image": tf.image.random_crop(image, (CROP, CROP, 3)), "label": label}

        ds = ds.map(decode, num_parallel_calls=workers or None).batch(BATCH, drop_remainder=True)
        ds = ds.repeat().prefetch(2)
        yield from to_global(({k: v.numpy() for k, v in b.items()} for b in ds), BATCH)

    return run


def _add_flags(parser: Any) -> None:
    parser.add_argument("--examples", type=int, default=60_000)
    parser.add_argument("--entries", help="comma-separated entries to run (with the loop)")


def main() -> None:
    use_cpu_devices()
    args = arguments(__doc__, seconds=2.0, rounds=7, smoke=SMOKE, add=_add_flags)
    encoded, labels = encode_all(args.examples)
    pngs = {"png": encoded, "label": labels}
    entries: dict[str, Any] = {
        "loop": lambda: decode_loop(encoded, labels, args.seconds),
        "loop x2": lambda: loops_rate(2, args.seconds),
    }
    kinds = {"loop": ("floor", 1), "loop x2": ("floor", 2)}
    for w in (2,) if args.smoke else (1, 2):  # the smoke: each entry's code once
        runs = {
            f"meshfeed:{w}": ("meshfeed", meshfeed_run(pngs, w)),
            f"meshfeed-threads:{w}": ("meshfeed", meshfeed_run(pngs, w, "threads")),
            f"torch:{w}": ("peer", torch_run(encoded, labels, w)),
            f"grain:{w}": ("peer", _grain(encoded, labels, w)),
            f"tfdata:{w}": ("peer", _tfdata(encoded, labels, w)),
        }
        for name, (kind, run) in runs.items():
            kinds[name] = (kind, w)
            entries[name] = (
                run
                if isinstance(run, str)
                else lambda run=run: measure(run, BATCH, args.seconds, warmup=5)
            )
    if args.entries:
        wanted = ["loop", "loop x2", *args.entries.split(",")]
        entries = {k: v for k, v in entries.items() if k in wanted}
    per_round = in_rounds(entries, args.rounds)
    for name, entry in entries.items():
        kind, w = kinds[name]
        line: dict[str, Any] = {
            "workload": "C",
            "name": name,
            "kind": kind,
            "num_workers": 0 if name.startswith("loop") else w,
            "global_batch_size": BATCH,
            "examples": args.examples,
            "rounds": args.rounds,
        }
        if isinstance(entry, str):
            emit("decode_throughput", smoke=args.smoke, **line, skipped=entry)
            continue
        line["samples_per_s"] = round(median_of(per_round, name) or 0.0)
        line["ratio_to_loop"] = median_ratio(per_round, name, "loop")
        optional = {}
        if not name.startswith("loop"):
            optional["ratio_to_torch"] = median_ratio(per_round, name, f"torch:{w}")
            if w == 2:
                optional["share_of_two_cores"] = median_ratio(per_round, name, "loop x2")
        if name.endswith(":2"):
            one = name.replace(":2", ":1")
            optional["speedup_from_1_worker"] = median_ratio(per_round, name, one)
        line.update({k: v for k, v in optional.items() if v is not None})
        emit("decode_throughput", smoke=args.smoke, **line)


if __name__ == "__main__":
    main()
