"""Packing: padding, packed tokens/s into global arrays, and planning cost, against Grain.

Documents with log-normal lengths, as web text has them (median ~400 tokens, a long
tail), packed into rows of ``seq_len`` 2048 on one process with 8 CPU devices:

- **padding**: ``meshfeed.pack`` (best fit, default window) against Grain's
  ``BestFitPackIterDataset`` (at several ``num_packing_bins``) on the same documents.
  Grain wants documents no longer than ``seq_len``, so it gets them cut into
  ``seq_len`` pieces first -- the pieces ``long_docs="split"`` makes.
- **throughput**: packed rows to global ``jax.Array`` batches (global batch 16, split
  over 8 devices): ``Loader(pack(source))`` against Grain's pipeline (source ->
  best-fit packing -> batch -> ``make_array_from_process_local_data``), rounds in
  rotating order, the median of the per-round ratios.
- **planning**: the time and memory to plan 1M documents (the plan's arrays, and the
  peak traced while planning), per document.

Prints one JSON line per measurement; ``--smoke`` for CI.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import json
import platform
import statistics
import time
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
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


def grain_rows(documents: list[dict[str, np.ndarray]], bins: int) -> Any:
    import grain
    import grain.experimental as ge

    ds = grain.MapDataset.source(documents).repeat(None).to_iter_dataset()
    return ge.BestFitPackIterDataset(
        ds, length_struct={"tokens": SEQ_LEN}, num_packing_bins=bins, seed=0
    )


def grain_padding(documents: list[dict[str, np.ndarray]], bins: int) -> float:
    import grain
    import grain.experimental as ge

    ds = grain.MapDataset.source(documents).to_iter_dataset()
    rows = ge.BestFitPackIterDataset(
        ds, length_struct={"tokens": SEQ_LEN}, num_packing_bins=bins, seed=0
    )
    count = tokens = 0
    for row in rows:
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
    names = list(entries)
    ratios, rates = [], {n: [] for n in names}
    for r in range(rounds):
        got = {}
        for name in names[r % 2 :] + names[: r % 2]:
            got[name] = measure(entries[name], BATCH, seconds) * SEQ_LEN
            rates[name].append(got[name])
        ratios.append(got["meshfeed"] / got["grain"])
    return {
        "meshfeed_tokens_per_s": round(statistics.median(rates["meshfeed"])),
        "grain_tokens_per_s": round(statistics.median(rates["grain"])),
        "ratio_to_grain": round(statistics.median(ratios), 2),
    }


def planning(n: int) -> dict[str, float]:
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny run for CI")
    args = parser.parse_args()
    docs, plan_docs, rounds, seconds = (
        (2_000, 50_000, 1, 0.3) if args.smoke else (20_000, 1_000_000, 5, 1.0)
    )
    common = {
        "benchmark": "packing",
        "seq_len": SEQ_LEN,
        "smoke": args.smoke,
        "jax": jax.__version__,
        "python": platform.python_version(),
    }
    src = source(docs)
    packed = meshfeed.pack(src, SEQ_LEN)
    line = {
        **common,
        "name": "padding",
        "documents": docs,
        "meshfeed": round(packed.stats()["padding_fraction"], 5),
    }
    for bins in (64, 256) if args.smoke else (64, 256, 1024):
        line[f"grain_{bins}_bins"] = round(grain_padding(grain_documents(src), bins), 5)
    print(json.dumps(line), flush=True)
    print(
        json.dumps(
            {
                **common,
                "name": "throughput",
                "documents": docs,
                "global_batch_size": BATCH,
                "grain_bins": 256,
                **throughput(src, 256, rounds, seconds),
            }
        ),
        flush=True,
    )
    print(json.dumps({**common, "name": "planning", **planning(plan_docs)}), flush=True)


if __name__ == "__main__":
    main()
