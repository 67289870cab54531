"""Workload E, input wait: the demo convnet trained by ``fit`` on the digits, per ``prefetch``."""

from __future__ import annotations

from typing import Any

from harness import arguments, emit, use_cpu_devices
from remote_fns import FIT_DIGITS, figures, fit_figures, loader

import meshfeed
from common import DIGITS_BATCH_SIZE, Remote, digits

LATENCIES_S = {"memory": 0.0, "remote 2ms": 0.002, "remote 20ms": 0.020}


def run(source: str, prefetch: Any, steps: int) -> dict[str, float]:
    data, latency = meshfeed.ArraySource(digits()), LATENCIES_S[source]
    fed = loader(Remote(data, latency) if latency else data, DIGITS_BATCH_SIZE, prefetch=prefetch)
    return {**fit_figures(fed, steps), "prefetch_peak_bytes": fed.prefetch_peak_bytes}


def main() -> None:
    use_cpu_devices()
    args = arguments(__doc__, rounds=3)
    steps = 20 if args.smoke else 1000
    cases = {f"fit:{s}:prefetch={p}": (s, p) for s in LATENCIES_S for p in (0, 2, "auto")}
    per_round = [{k: run(*case, steps) for k, case in cases.items()} for _ in range(args.rounds)]
    head = {"smoke": args.smoke, "steps": steps, "global_batch_size": DIGITS_BATCH_SIZE}
    for name, (source, prefetch) in cases.items():
        emit(
            "input_wait",
            **head,
            workload="E" if source == "memory" else f"E {source}",
            name=name,
            source=source,
            latency_ms=1000 * LATENCIES_S[source],
            prefetch=prefetch,
            default=prefetch == "auto",
            **figures(per_round, name, FIT_DIGITS),
            prefetch_peak_bytes=round(max(r[name]["prefetch_peak_bytes"] for r in per_round)),
            prefetch_bytes=meshfeed.types.LoaderOptions.prefetch_bytes,
        )


if __name__ == "__main__":
    main()
