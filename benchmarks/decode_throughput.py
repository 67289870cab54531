"""Workload C, decode: PNG-encoded 32x32 RGB images decoded and randomly cropped per record.

60000 images are PNG-encoded at set-up (PIL). Each entry decodes every image it loads
and takes a random 28x28 crop, shuffled, global batch 256, and ends in the same global
``jax.Array`` on 8 CPU devices in one process:

- ``loop``: one core decoding and cropping in a plain Python loop, no loader (the yard
  stick: two cores can do at most twice this);
- ``loop x2``: two processes running that loop at once, nothing else: what the two cores
  of this machine really give (a virtual machine's cores share caches and lose time to
  the host, so less than twice ``loop``);
- ``meshfeed:W``: ``Loader(record_transform=decode_crop, num_workers=W)``, worker
  processes; ``meshfeed-threads:W``: the same with ``worker_type="threads"``;
- ``torch:W``: the PyTorch ``DataLoader(num_workers=W)`` over a map-style dataset that
  decodes and crops, numpy collate, then ``make_array_from_process_local_data``;
- ``grain:W``: Grain ``MapDataset.source().shuffle().random_map().batch()`` with
  ``mp_prefetch`` on W workers, then the same;
- tf.data when tensorflow is installed (it is not, in CI).

Every round times each entry once, in an order that rotates from round to round (the
entry that runs right after another's teardown pays for it), and each entry's ratios
are taken within its round: the lines report the median over rounds.

Goal: meshfeed with 2 workers >= 1.6x the plain loop (80% of two cores) and >= 1.1x the
DataLoader with 2 workers; ``share_of_two_cores`` is the share of ``loop x2`` reached.
Prints one JSON line per entry; ``--smoke`` for CI.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_fns import CROP, decode_crop, decode_crop_seeded, encode_all

import meshfeed
from common import loops_at_once, measure, to_global

BATCH = 256


def _loop(encoded: np.ndarray, labels: np.ndarray, seconds: float) -> float:
    """Records per second of ``decode_crop`` in a plain loop on this core."""
    rng = np.random.default_rng(0)
    done, start = 0, time.perf_counter()
    while True:
        for i in range(0, len(labels), 256):
            for j in range(i, min(i + 256, len(labels))):
                decode_crop({"png": encoded[j], "label": labels[j]}, rng)
            done += min(256, len(labels) - i)
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                return done / elapsed


_LOOP_SCRIPT = """
import sys, time
sys.path.insert(0, {here!r})
import numpy as np
from decode_fns import decode_crop, encode_all
encoded, labels = encode_all({n})
print("ready", flush=True)
sys.stdin.readline()
rng = np.random.default_rng(0)
done, start = 0, time.perf_counter()
while time.perf_counter() - start < {seconds}:
    for j in range(len(labels)):
        decode_crop({{"png": encoded[j], "label": labels[j]}}, rng)
    done += len(labels)
print(done / (time.perf_counter() - start), flush=True)
"""


def _loops_at_once(count: int, seconds: float, n: int = 2048, loop: str = _LOOP_SCRIPT) -> float:
    """Records per second of ``count`` processes running a loop (by default the plain
    one) together: ``loop`` is a script that prints ``ready``, waits for a line, loops
    for ``{seconds}`` over ``encode_all({n})`` and prints its records per second."""
    script = loop.format(here=str(Path(__file__).parent), n=n, seconds=seconds)
    return loops_at_once(script, count)


def _meshfeed(
    source: dict[str, np.ndarray],
    workers: int,
    worker_type: str = "processes",
    fn: Any = decode_crop,
) -> Callable[[], Iterator]:
    """``Loader(record_transform=fn, num_workers=workers)`` over ``source``, endless."""
    sharding = meshfeed.batch_sharding(meshfeed.make_mesh(data=8))

    def run() -> Iterator[Any]:
        loader = meshfeed.Loader(
            meshfeed.ArraySource(source),
            global_batch_size=BATCH,
            sharding=sharding,
            record_transform=fn,
            num_workers=workers,
            worker_type=worker_type,  # type: ignore[arg-type]
            num_epochs=None,
        )
        try:
            yield from loader
        finally:
            loader.close()

    return run


class _TorchDataset:
    def __init__(self, encoded: np.ndarray, labels: np.ndarray) -> None:
        self.encoded, self.labels = encoded, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return decode_crop_seeded(self.encoded[i], self.labels[i], i)


def _collate(records: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.stack([r[k] for r in records]) for k in records[0]}


def _torch(encoded: np.ndarray, labels: np.ndarray, workers: int) -> Callable[[], Iterator] | str:
    try:
        import torch
        from torch.utils.data import DataLoader
    except ImportError:
        return "torch is not installed (pip install 'meshfeed[bench]')"

    def run() -> Iterator[Any]:
        loader = DataLoader(
            _TorchDataset(encoded, labels),  # type: ignore[arg-type]
            batch_size=BATCH,
            shuffle=True,
            drop_last=True,
            collate_fn=_collate,
            num_workers=workers,
            persistent_workers=workers > 0,
            generator=torch.Generator().manual_seed(0),
        )
        while True:
            yield from to_global(iter(loader), BATCH)

    return run


class _Records:
    def __init__(self, encoded: np.ndarray, labels: np.ndarray) -> None:
        self.encoded, self.labels = encoded, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"png": self.encoded[i], "label": self.labels[i]}


def _grain_map(record: dict[str, Any], rng: np.random.Generator) -> dict[str, np.ndarray]:
    return decode_crop(record, rng)


def _grain(encoded: np.ndarray, labels: np.ndarray, workers: int) -> Callable[[], Iterator] | str:
    try:
        import grain
    except ImportError:
        return "grain is not installed (pip install 'meshfeed[bench]')"

    from absl import flags

    if not flags.FLAGS.is_parsed():  # grain's worker processes read absl flags
        flags.FLAGS.mark_as_parsed()

    def run() -> Iterator[Any]:
        ds = (
            grain.MapDataset.source(_Records(encoded, labels))
            .shuffle(seed=0)
            .random_map(_grain_map, seed=0)
            .batch(BATCH, drop_remainder=True, batch_fn=_collate)
            .repeat()
            .to_iter_dataset()
        )
        if workers:
            ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
        yield from to_global(iter(ds), BATCH)

    return run


def _tfdata(encoded: np.ndarray, labels: np.ndarray, workers: int) -> Callable[[], Iterator] | str:
    try:
        import tensorflow as tf  # type: ignore[import-not-found]
    except ImportError:
        return "tensorflow is not installed"

    def run() -> Iterator[Any]:
        ds = tf.data.Dataset.from_tensor_slices((list(encoded), labels)).shuffle(10_000, seed=0)

        def decode(png: Any, label: Any) -> Any:
            image = tf.io.decode_png(png, channels=3)
            return {"image": tf.image.random_crop(image, (CROP, CROP, 3)), "label": label}

        ds = ds.map(decode, num_parallel_calls=workers or None).batch(BATCH, drop_remainder=True)
        ds = ds.repeat().prefetch(2)
        yield from to_global(({k: v.numpy() for k, v in b.items()} for b in ds), BATCH)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny data and timings, for CI")
    parser.add_argument("--seconds", type=float, default=2.0, help="per entry per round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds; the median")
    parser.add_argument("--examples", type=int, default=60_000)
    parser.add_argument("--entries", help="comma-separated entries to run (with the loop)")
    args = parser.parse_args()
    seconds, rounds, n = (
        (0.3, 1, 2048) if args.smoke else (args.seconds, args.rounds, args.examples)
    )
    encoded, labels = encode_all(n)
    entries: dict[str, tuple[str, int, Any]] = {
        "loop": ("floor", 1, None),
        "loop x2": ("floor", 2, "loops"),
    }
    for w in (2,) if args.smoke else (1, 2):  # the smoke: each entry's code once
        pngs = {"png": encoded, "label": labels}
        entries[f"meshfeed:{w}"] = ("meshfeed", w, _meshfeed(pngs, w))
        entries[f"meshfeed-threads:{w}"] = ("meshfeed", w, _meshfeed(pngs, w, "threads"))
        entries[f"torch:{w}"] = ("peer", w, _torch(encoded, labels, w))
        entries[f"grain:{w}"] = ("peer", w, _grain(encoded, labels, w))
        entries[f"tfdata:{w}"] = ("peer", w, _tfdata(encoded, labels, w))
    if args.entries:
        wanted = ["loop", "loop x2", *args.entries.split(",")]
        entries = {k: v for k, v in entries.items() if k in wanted}
    names = [k for k, (_, _, run) in entries.items() if run == "loops" or not isinstance(run, str)]
    per_round: list[dict[str, float]] = []
    for r in range(rounds):
        rate: dict[str, float] = {}
        for name in names[r % len(names) :] + names[: r % len(names)]:
            _, _, run = entries[name]
            if run is None:
                rate[name] = _loop(encoded, labels, seconds)
            elif run == "loops":
                rate[name] = _loops_at_once(2, seconds)
            else:
                rate[name] = measure(run, BATCH, seconds, warmup=5)
            gc.collect()
            time.sleep(0.3)  # let the entry's workers go before the next one starts
        per_round.append(rate)

    def median(fn: Callable[[dict[str, float]], float | None]) -> float | None:
        values = [v for v in map(fn, per_round) if v is not None]
        return round(statistics.median(values), 3) if values else None

    for name, (kind, w, run) in entries.items():
        line: dict[str, Any] = {
            "benchmark": "decode_throughput",
            "workload": "C",
            "name": name,
            "kind": kind,
            "num_workers": 0 if name.startswith("loop") else w,
            "global_batch_size": BATCH,
            "examples": n,
            "rounds": rounds,
            "devices": jax.device_count(),
            "processes": jax.process_count(),
            "smoke": args.smoke,
            "jax": jax.__version__,
            "python": platform.python_version(),
        }
        if isinstance(run, str) and run != "loops":
            line["skipped"] = run
            print(json.dumps(line), flush=True)
            continue
        line["samples_per_s"] = round(statistics.median(r[name] for r in per_round))
        line["ratio_to_loop"] = median(lambda r, name=name: r[name] / r["loop"])
        torch_w = f"torch:{w}"
        if not name.startswith("loop") and torch_w in names:
            line["ratio_to_torch"] = median(lambda r, name=name, t=torch_w: r[name] / r[t])
        one = name.replace(":2", ":1")
        if name.endswith(":2") and one in names:
            line["speedup_from_1_worker"] = median(lambda r, name=name, one=one: r[name] / r[one])
        if w == 2 and not name.startswith("loop") and "loop x2" in names:
            line["share_of_two_cores"] = median(lambda r, name=name: r[name] / r["loop x2"])
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
