"""Workload E, input wait: a small convnet trained by ``fit``; time spent waiting for input.

One process, 8 CPU devices, the digits (batch 64) and the demo's convnet trained by
``fit`` with ``prefetch`` at 0, 2 and ``"auto"``, the digits in memory and behind 2 ms
and 20 ms of latency per read: the devices' share of time waiting for input, time in
``next(loader)``, samples/s, the read-ahead's depth and bytes. Goal: input wait <= 2%
by default at 2 ms and 20 ms, within ``prefetch_bytes``. ``--smoke`` for CI.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import arguments, emit, use_cpu_devices

import meshfeed
from common import DIGITS_BATCH_SIZE as GLOBAL_BATCH_SIZE
from common import Remote, digits, fit_digits

LATENCIES_S = {"memory": 0.0, "remote 2ms": 0.002, "remote 20ms": 0.020}


def run(source: str, prefetch: meshfeed.types.Prefetch, steps: int) -> dict[str, float]:
    train = digits()
    mesh = meshfeed.make_mesh(data=8)
    data = meshfeed.ArraySource(train)
    latency = LATENCIES_S[source]
    loader = meshfeed.Loader(
        Remote(data, latency) if latency else data,
        global_batch_size=GLOBAL_BATCH_SIZE,
        sharding=meshfeed.batch_sharding(mesh),
        num_epochs=None,
        prefetch=prefetch,
    )
    history = fit_digits(loader, steps)
    return {
        "input_wait_share": history.input_wait_share,
        "loader_share": history.loader_share,
        "samples_per_s": history.samples_per_s,
        "prefetch_depth": float(loader.prefetch_depth),
        "prefetch_peak_bytes": float(loader.prefetch_peak_bytes),
    }


def _add_flags(parser: Any) -> None:
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--default-only", action="store_true", help='prefetch="auto" alone')


def main() -> None:
    use_cpu_devices()
    args = arguments(__doc__, rounds=3, smoke={"steps": 20, "rounds": 1}, add=_add_flags)
    settings: tuple[meshfeed.types.Prefetch, ...] = (
        ("auto",) if args.default_only else (0, 2, "auto")
    )
    results: dict[tuple[str, meshfeed.types.Prefetch], list[dict[str, float]]] = {
        (source, p): [] for source in LATENCIES_S for p in settings
    }
    for _ in range(args.rounds):
        for source, prefetch in results:
            results[source, prefetch].append(run(source, prefetch, args.steps))
    for (source, prefetch), runs in results.items():

        def median(key: str, runs: list[dict[str, float]] = runs) -> float:
            return statistics.median(r[key] for r in runs)

        emit(
            "input_wait",
            smoke=args.smoke,
            workload="E" if source == "memory" else f"E {source}",
            name=f"fit:{source}:prefetch={prefetch}",
            source=source,
            latency_ms=1000 * LATENCIES_S[source],
            prefetch=prefetch,
            default=prefetch == "auto",
            input_wait_share=round(median("input_wait_share"), 4),
            loader_share=round(median("loader_share"), 4),
            samples_per_s=round(median("samples_per_s")),
            prefetch_depth=round(median("prefetch_depth")),
            prefetch_peak_bytes=round(max(r["prefetch_peak_bytes"] for r in runs)),
            prefetch_bytes=meshfeed.types.LoaderOptions.prefetch_bytes,
            steps=args.steps,
            global_batch_size=GLOBAL_BATCH_SIZE,
        )


if __name__ == "__main__":
    main()
