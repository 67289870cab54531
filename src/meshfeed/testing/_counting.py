"""What one of the pipeline's counters costs: ``counter_price``, for the benchmark that
sets it against the steps it counts (``benchmarks/stats.py``)."""

from __future__ import annotations

import time

from meshfeed.core._tally import Tally

WIDEST = 10  # amounts in the widest add a stage makes (the consumer's, once a step)


def counter_price(times: int = 1_000_000, repeats: int = 5, amounts: int = WIDEST) -> float:
    """Seconds of one add of ``amounts`` amounts to a stage's counter, with the two clock
    reads that time the stage around it: the best of ``repeats`` runs of ``times`` adds
    on one thread. By default as wide as the widest add (an upper bound for the others)."""
    counter = Tally(*(f"amount{i}" for i in range(amounts)))
    values = (1.0,) * (amounts - 1)
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        for _ in range(times):
            t = time.perf_counter()
            counter.add(time.perf_counter() - t, *values)
        best = min(best, (time.perf_counter() - began) / times)
    return best
