"""Packing: padding, packed tokens/s into global arrays, and planning cost, against Grain.

Log-normal document lengths packed into rows of 2048: ``meshfeed.pack`` against Grain's
``BestFitPackIterDataset`` (documents cut to ``seq_len`` first, as Grain wants them) for
padding and throughput, and the time and memory to plan 1M documents. ``--smoke`` for CI;
the workload is in ``benchmarks/README.md``.
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
from harness import arguments, emit, in_rounds, median_of, median_ratio, use_cpu_devices
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshfeed
from common import measure, to_global

SEQ_LEN = 2048
BATCH = 16


def lengths(n: int, seed: int = 0) -> np.ndarray:
    """Web-text-like document lengths: log-normal, median ~400 tokens."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(6.0, 1.1, n), 1, None).astype(np.int64)


def source(n: int) -> meshfeed.ArraySource:
    sizes = lengths(n)
    rng = np.random.default_rng(1)
    values = rng.integers(1, 50_000, int(sizes.sum()), dtype=np.int32)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return meshfeed.ArraySource({"tokens": meshfeed.Ragged(values, offsets)})


def grain_documents(src: meshfeed.ArraySource) -> list[dict[str, np.ndarray]]:
    """The documents cut into pieces of at most SEQ_LEN tokens, as Grain wants them."""
    docs = src[np.arange(len(src))]["tokens"]
    return [
        {"tokens": doc[start : start + SEQ_LEN]}
        for doc in docs.to_list()
        for start in range(0, len(doc), SEQ_LEN)
    ]


def grain_rows(documents: list[dict[str, np.ndarray]], bins: int, repeat: bool = True) -> Any:
    """Grain's best-fit packing of ``documents`` (over and over, if ``repeat``)."""
    import grain
    import grain.experimental as ge

    ds = grain.MapDataset.source(documents)
    ds = (ds.repeat(None) if repeat else ds).to_iter_dataset()
    return ge.BestFitPackIterDataset(
        ds, length_struct={"tokens": SEQ_LEN}, num_packing_bins=bins, seed=0
    )


def grain_padding(documents: list[dict[str, np.ndarray]], bins: int) -> float:
    count = tokens = 0
    for row in grain_rows(documents, bins, repeat=False):
        count += 1
        tokens += int((row["tokens_segment_ids"] > 0).sum())
    return 1 - tokens / (count * SEQ_LEN)


def throughput(src: meshfeed.ArraySource, bins: int, rounds: int, seconds: float) -> dict:
    mesh = meshfeed.make_mesh(data=jax.device_count())
    packed = meshfeed.pack(src, SEQ_LEN)
    documents = grain_documents(src)

    def ours() -> Iterator[Any]:
        return iter(
            meshfeed.Loader(
                packed,
                global_batch_size=BATCH,
                sharding=NamedSharding(mesh, P("data", None)),
                num_epochs=None,
            )
        )

    def grain() -> Iterator[Any]:
        rows = iter(grain_rows(documents, bins))

        def batches() -> Iterator[dict[str, np.ndarray]]:
            while True:
                group = [next(rows) for _ in range(BATCH)]
                yield {k: np.stack([r[k] for r in group]) for k in group[0]}

        return to_global(batches(), BATCH)

    entries: dict[str, Callable[[], Iterator[Any]]] = {"meshfeed": ours, "grain": grain}
    per_round = in_rounds(
        {name: lambda e=e: measure(e, BATCH, seconds) * SEQ_LEN for name, e in entries.items()},
        rounds,
    )
    return {
        "meshfeed_tokens_per_s": round(median_of(per_round, "meshfeed") or 0),
        "grain_tokens_per_s": round(median_of(per_round, "grain") or 0),
        "ratio_to_grain": median_ratio(per_round, "meshfeed", "grain", digits=2),
    }


def planning(n: int) -> dict[str, Any]:
    sizes = lengths(n, seed=2)
    src = meshfeed.ArraySource(
        {
            "tokens": meshfeed.Ragged(
                np.zeros(int(sizes.sum()), np.int32), np.concatenate([[0], np.cumsum(sizes)])
            )
        }
    )
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
    run = {"seq_len": SEQ_LEN, "smoke": args.smoke}
    src = source(docs)
    packed = meshfeed.pack(src, SEQ_LEN)
    padding = {"documents": docs, "meshfeed": round(packed.stats()["padding_fraction"], 5)}
    for bins in (64, 256) if args.smoke else (64, 256, 1024):
        padding[f"grain_{bins}_bins"] = round(grain_padding(grain_documents(src), bins), 5)
    emit("packing", name="padding", **run, **padding)
    speed = {"documents": docs, "global_batch_size": BATCH, "grain_bins": 256}
    emit("packing", name="throughput", **run, **speed, **throughput(src, 256, rounds, seconds))
    emit("packing", name="planning", **run, **planning(plan_docs))


if __name__ == "__main__":
    main()
