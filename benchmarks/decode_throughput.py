"""Workload C, decode: PNG-encoded 32x32 RGB images decoded and randomly cropped per record."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from decode_fns import CROP, decode_crop, decode_loop, encode_all
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
    """Records/s of ``count`` processes running ``loop`` at once (``common.loops_at_once``;
    formatted with ``here``, ``n`` and ``seconds``), by default the plain decode loop."""
    return loops_at_once(loop.format(here=str(Path(__file__).parent), n=n, seconds=seconds), count)


def meshfeed_run(
    source: dict[str, np.ndarray], workers: int, kind: str = "processes", fn: Any = decode_crop
) -> Run:
    """``Loader(record_transform=fn, num_workers=workers)`` over ``source``, endless."""
    options = {"record_transform": fn, "num_workers": workers, "worker_type": kind}
    return loader_batches(lambda: meshfeed.ArraySource(source), BATCH, **options)


class DecodedImages(Records):
    """The PyTorch map-style dataset: image ``i`` decoded and cropped with its own seed."""

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return decode_crop(super().__getitem__(i), np.random.default_rng(i))


def _grain(pngs: dict[str, np.ndarray], workers: int) -> Run | str:
    try:
        import grain
        from absl import flags
    except ImportError:
        return not_installed("grain")
    if not flags.FLAGS.is_parsed():  # grain's worker processes read absl flags
        flags.FLAGS.mark_as_parsed()

    def run() -> Any:
        ds = (
            grain.MapDataset.source(Records(pngs))
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


def _tfdata(pngs: dict[str, np.ndarray], workers: int) -> Run | str:
    try:
        import tensorflow as tf  # type: ignore[import-not-found]
    except ImportError:
        return "tensorflow is not installed"

    def decode(png: Any, label: Any) -> Any:
        image = tf.io.decode_png(png, channels=3)
        return {"image": tf.image.random_crop(image, (CROP, CROP, 3)), "label": label}

    def run() -> Any:
        ds = tf.data.Dataset.from_tensor_slices((list(pngs["png"]), pngs["label"]))
        ds = ds.shuffle(10_000, seed=0).map(decode, num_parallel_calls=workers or None)
        ds = ds.batch(BATCH, drop_remainder=True).repeat().prefetch(2)
        yield from to_global(({k: v.numpy() for k, v in b.items()} for b in ds), BATCH)

    return run


def _flags(parser: Any) -> None:
    parser.add_argument("--examples", type=int, default=60_000)


def main() -> None:
    use_cpu_devices()
    args = arguments(__doc__, seconds=2.0, rounds=7, smoke=SMOKE, add=_flags)
    encoded, labels = encode_all(args.examples)
    pngs = {"png": encoded, "label": labels}
    entries: dict[str, Any] = {
        "loop": lambda: decode_loop(encoded, labels, args.seconds),
        "loop x2": lambda: loops_rate(2, args.seconds),
    }
    for w in (2,) if args.smoke else (1, 2):  # the smoke: each entry's code once
        runs = {
            "meshfeed": meshfeed_run(pngs, w),
            "meshfeed-threads": meshfeed_run(pngs, w, "threads"),
            "torch": torch_batches(DecodedImages(pngs), BATCH, workers=w),
            "grain": _grain(pngs, w),
            "tfdata": _tfdata(pngs, w),
        }
        for peer, run in runs.items():
            timed = partial(measure, run, BATCH, args.seconds, warmup=5)
            entries[f"{peer}:{w}"] = run if isinstance(run, str) else timed
    per_round = in_rounds(entries, args.rounds)
    for name, entry in entries.items():
        peer, _, workers = name.partition(":")  # the loops: no workers, the floor
        w = int(workers or 0)
        kind = "floor" if not w else "meshfeed" if peer.startswith("meshfeed") else "peer"
        line: dict[str, Any] = {"workload": "C", "name": name, "kind": kind, "num_workers": w}
        line |= {"global_batch_size": BATCH, "examples": args.examples, "rounds": args.rounds}
        if isinstance(entry, str):
            emit("decode_throughput", smoke=args.smoke, **line, skipped=entry)
            continue
        bases = {"ratio_to_loop": "loop"}
        if kind != "floor":
            bases["ratio_to_torch"] = f"torch:{w}"
            if w == 2:
                bases["share_of_two_cores"] = "loop x2"
        if name.endswith(":2"):
            bases["speedup_from_1_worker"] = name.replace(":2", ":1")
        ratios = {key: median_ratio(per_round, name, base) for key, base in bases.items()}
        line["samples_per_s"] = round(median_of(per_round, name) or 0.0)
        line |= {key: ratio for key, ratio in ratios.items() if ratio is not None}
        emit("decode_throughput", smoke=args.smoke, **line)


if __name__ == "__main__":
    main()
