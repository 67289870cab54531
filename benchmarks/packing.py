"""Packing: padding, packed tokens/s into global arrays and planning cost, against Grain's
``BestFitPackIterDataset`` (documents cut to ``seq_len`` first, as Grain wants them)."""

from __future__ import annotations

import functools
import itertools
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import numpy as np
from harness import arguments, emit, in_rounds, median_of, median_ratio, use_cpu_devices

import meshfeed
from common import collate, loader_batches, measure, to_global

SEQ_LEN = 2048
BATCH = 16


def lengths(n: int, seed: int = 0) -> np.ndarray:
    """Web-text-like document lengths: log-normal, median ~400 tokens."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(6.0, 1.1, n), 1, None).astype(np.int64)


def source(sizes: np.ndarray, values: np.ndarray | None = None) -> meshfeed.ArraySource:
    """Documents of ``sizes`` tokens: ``values``, or a zero-byte view (a plan reads the
    lengths alone)."""
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    if values is None:
        values = np.broadcast_to(np.zeros(1, np.uint8), (int(offsets[-1]),))
    return meshfeed.ArraySource({"tokens": meshfeed.Ragged(values, offsets)})


def grain_rows(src: meshfeed.ArraySource, bins: int, repeat: bool = True) -> Any:
    """Grain's best-fit packing of the documents cut into pieces of at most SEQ_LEN tokens
    (over and over, if ``repeat``)."""
    import grain
    import grain.experimental as ge

    docs = src[np.arange(len(src))]["tokens"].to_list()
    cut = [{"tokens": d[i : i + SEQ_LEN]} for d in docs for i in range(0, len(d), SEQ_LEN)]
    ds = grain.MapDataset.source(cut)
    ds = (ds.repeat(None) if repeat else ds).to_iter_dataset()
    return ge.BestFitPackIterDataset(
        ds, length_struct={"tokens": SEQ_LEN}, num_packing_bins=bins, seed=0
    )


def throughput(src: meshfeed.ArraySource, bins: int, rounds: int, seconds: float) -> dict:
    packed = meshfeed.pack(src, SEQ_LEN)

    def grain() -> Iterator[Any]:
        rows = iter(grain_rows(src, bins))
        batches = (collate([next(rows) for _ in range(BATCH)]) for _ in itertools.count())
        return to_global(batches, BATCH)

    runs = {"meshfeed": loader_batches(lambda: packed, BATCH), "grain": grain}
    entries = {name: functools.partial(measure, run, BATCH, seconds) for name, run in runs.items()}
    per_round = in_rounds(entries, rounds)
    return {
        **{f"{n}_tokens_per_s": round((median_of(per_round, n) or 0) * SEQ_LEN) for n in runs},
        "ratio_to_grain": median_ratio(per_round, "meshfeed", "grain", digits=2),
    }


def planning(n: int) -> dict[str, Any]:
    src = source(lengths(n, seed=2))
    start = time.perf_counter()
    packed = meshfeed.pack(src, SEQ_LEN)
    seconds = time.perf_counter() - start
    tracemalloc.start()
    meshfeed.pack(src, SEQ_LEN)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {
        "documents": n,
        "seconds": round(seconds, 2),
        "plan_bytes_per_document": round(packed.plan.nbytes / n, 2),
        "peak_bytes_per_document": round(peak / n, 2),
        "padding_fraction": round(packed.stats()["padding_fraction"], 5),
    }


def main() -> None:
    use_cpu_devices()
    args = arguments(__doc__)
    docs, plan_docs = (2_000, 50_000) if args.smoke else (20_000, 1_000_000)
    rounds, seconds = (1, 0.3) if args.smoke else (5, 1.0)
    sizes = lengths(docs)
    src = source(sizes, np.random.default_rng(1).integers(1, 50_000, sizes.sum(), np.int32))
    run = {"seq_len": SEQ_LEN, "smoke": args.smoke}
    plain = meshfeed.pack(src, SEQ_LEN).stats()["padding_fraction"]
    padding = {"documents": docs, "meshfeed": round(plain, 5)}
    for bins in (64, 256) if args.smoke else (64, 256, 1024):
        real = [int((r["tokens_segment_ids"] > 0).sum()) for r in grain_rows(src, bins, False)]
        padding[f"grain_{bins}_bins"] = round(1 - sum(real) / (len(real) * SEQ_LEN), 5)
    emit("packing", name="padding", **run, **padding)
    speed = {"documents": docs, "global_batch_size": BATCH, "grain_bins": 256}
    emit("packing", name="throughput", **run, **speed, **throughput(src, 256, rounds, seconds))
    emit("packing", name="planning", **run, **planning(plan_docs))


if __name__ == "__main__":
    main()
