"""Workload E, input wait: the demo convnet trained by ``fit`` on the digits, in memory and
behind 2 ms and 20 ms per read, with ``prefetch`` at 0, 2 and ``"auto"``."""

from __future__ import annotations

from typing import Any

from harness import arguments, emit, use_cpu_devices
from remote_fns import figures, loader

import meshfeed
from common import DIGITS_BATCH_SIZE, Remote, digits, fit_digits

LATENCIES_S = {"memory": 0.0, "remote 2ms": 0.002, "remote 20ms": 0.020}


def run(source: str, prefetch: Any, steps: int) -> dict[str, float]:
    data, latency = meshfeed.ArraySource(digits()), LATENCIES_S[source]
    fed = loader(Remote(data, latency) if latency else data, DIGITS_BATCH_SIZE, prefetch=prefetch)
    history = fit_digits(fed, steps)
    return {
        **{k: getattr(history, k) for k in ("input_wait_share", "loader_share", "samples_per_s")},
        "prefetch_depth": fed.prefetch_depth,
        "prefetch_peak_bytes": fed.prefetch_peak_bytes,
    }


def _flags(parser: Any) -> None:
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--default-only", action="store_true", help='prefetch="auto" alone')


def main() -> None:
    use_cpu_devices()
    args = arguments(__doc__, rounds=3, smoke={"steps": 20, "rounds": 1}, add=_flags)
    settings = ("auto",) if args.default_only else (0, 2, "auto")
    cases = {f"fit:{s}:prefetch={p}": (s, p) for s in LATENCIES_S for p in settings}
    per_round = [
        {k: run(*case, args.steps) for k, case in cases.items()} for _ in range(args.rounds)
    ]
    medians = {
        "input_wait_share": 4,
        "loader_share": 4,
        "samples_per_s": None,
        "prefetch_depth": None,
    }
    for name, (source, prefetch) in cases.items():
        emit(
            "input_wait",
            smoke=args.smoke,
            workload="E" if source == "memory" else f"E {source}",
            name=name,
            source=source,
            latency_ms=1000 * LATENCIES_S[source],
            prefetch=prefetch,
            default=prefetch == "auto",
            **figures(per_round, name, medians),
            prefetch_peak_bytes=round(max(r[name]["prefetch_peak_bytes"] for r in per_round)),
            prefetch_bytes=meshfeed.types.LoaderOptions.prefetch_bytes,
            steps=args.steps,
            global_batch_size=DIGITS_BATCH_SIZE,
        )


if __name__ == "__main__":
    main()
