"""Balanced steps in the loader: a source's steps of even cost, dealt to the devices.

A source that serves its rows in steps of even cost (``BalancedSteps``: ``pack(...,
balance=, step_rows=G)``) lays them out as runs of ``G`` rows, each one step's. The
loader takes one run a step, the runs in a keyed order that changes every epoch (the
schedule's block order with one block a step: no length curriculum, since the order of
the steps is random while each step's rows cost alike), and deals each step's rows to
the data-parallel devices by cost (``_balance.arrange``): a pure function of the step's
rows and the number of devices, so every process agrees without talking, and a state
restored under another data-parallel size gives each later step the same rows, in the
order that size deals them. What each step's dealing leaves -- the slowest device's cost
over the mean -- is counted for ``loader.stats()``.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

import numpy as np

from meshfeed.core._tally import Tally
from meshfeed.data._balance import arrange, imbalance
from meshfeed.data._sources import BalancedSteps, Source
from meshfeed.feed._options import LoaderOptions
from meshfeed.feed._schedule import Schedule

KEPT = 64
"""Steps whose dealt ids are kept (several threads ask for a step's ids)."""


def step_rows(source: Source, options: LoaderOptions) -> int | None:
    """The rows of a balanced source's steps, checked against ``options``; ``None`` for
    any other source."""
    if not isinstance(source, BalancedSteps) or source.step_rows is None:
        return None
    rows = int(source.step_rows)
    if options.ramp:
        raise ValueError(
            f"the source serves steps of {rows} rows of even cost (pack(..., balance=, "
            f"step_rows={rows})), which a batch size by stages would cut across; pass "
            f"global_batch_size={rows}."
        )
    if options.batch_sizes.size(0) != rows:
        raise ValueError(
            f"global_batch_size={options.batch_sizes.size(0)}, but the source serves steps "
            f"of {rows} rows of even cost (pack(..., step_rows={rows})); pass "
            f"global_batch_size={rows}, or pack with step_rows= the batch size."
        )
    if options.shuffle_block is not None or options.shuffle_window is not None:
        raise ValueError(
            "shuffle_block/shuffle_window order blocks of rows, but the source serves "
            "steps of even cost, whose order the loader shuffles a step at a time; drop "
            "shuffle_block and shuffle_window."
        )
    return rows


class BalancedSchedule(Schedule):
    """A ``Schedule`` whose steps are a balanced source's runs of rows, each run's rows
    dealt to ``devices`` data-parallel devices by cost (the module docstring)."""

    def __init__(
        self,
        num_examples: int,
        rows: int,
        *,
        shuffle: bool,
        seed: int,
        costs: Callable[[np.ndarray], np.ndarray],
        devices: int,
    ) -> None:
        super().__init__(
            num_examples,
            rows,
            shuffle=shuffle,
            seed=seed,
            last_batch="drop",
            block=rows if shuffle else None,
            window=1,
        )
        self._costs = costs
        self.devices = devices
        self._dealt: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.tally = Tally("steps", "imbalance")
        """Steps dealt, and the sum of their imbalances."""
        self.last_imbalance: float | None = None
        """The imbalance of the step dealt last."""

    def ids(self, step: int) -> np.ndarray:
        """Step ``step``'s rows, dealt to the devices by cost (device ``d`` takes
        positions ``[d·G/D, (d+1)·G/D)``)."""
        with self._lock:
            dealt = self._dealt.get(step)
        if dealt is not None:
            return dealt
        ids = super().ids(step)
        costs = self._costs(ids)
        order = arrange(costs, self.devices)
        dealt = ids[order]
        left = imbalance(costs[order], self.devices)
        with self._lock:
            if step not in self._dealt:
                self._dealt[step] = dealt
                while len(self._dealt) > KEPT:
                    self._dealt.popitem(last=False)
                self.tally.add(1, left)
                self.last_imbalance = left
        return dealt
