"""What one of the pipeline's counters costs: ``counter_price``, for the benchmark that
sets it against the steps it counts (``benchmarks/stats.py``)."""

from __future__ import annotations

import time

from meshfeed.core._tally import Tally


def counter_price(times: int = 1_000_000, repeats: int = 5) -> float:
    """Seconds of one add to a stage's counter, with the two clock reads that time the
    stage around it: the best of ``repeats`` runs of ``times`` adds on one thread."""
    counter = Tally("calls", "records", "bytes", "seconds", "skipped")
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        for _ in range(times):
            t = time.perf_counter()
            counter.add(1, 256, 1024, time.perf_counter() - t)
        best = min(best, (time.perf_counter() - began) / times)
    return best
