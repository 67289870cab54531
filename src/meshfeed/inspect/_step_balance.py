"""What each step of a balanced pack asks of each device: ``step_balance``.

A pack with ``balance=`` serves its rows in steps of even cost, and the loader deals each
step's rows to the data-parallel devices by cost. ``step_balance`` computes, from the
plan alone (no devices, any device count), what that dealing gives: each device's cost
in each step, the step's imbalance (the slowest device over the mean) and its padding --
what ``plot_packing`` draws and ``benchmarks/balance.py`` measures at 8 to 512 devices.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from meshfeed.data._balance import arrange
from meshfeed.data._packed import Packed


class StepBalance(NamedTuple):
    """Each step's figures, in the order the steps are served (the loader shuffles them)."""

    loads: np.ndarray
    """``[steps, devices]``: each device's cost in each step."""
    imbalance: np.ndarray
    """``[steps]``: the slowest device's cost over the mean (1 for a step of no cost)."""
    padding: np.ndarray
    """``[steps]``: the share of the step's token slots that hold no token."""


def step_balance(packed: Packed, devices: int, *, steps: int | None = None) -> StepBalance:
    """Each step's cost on each of ``devices`` data-parallel devices, as the loader deals
    a balanced pack's steps (``pack(..., balance=, step_rows=)``).

    Args:
      packed: what ``meshfeed.pack`` returned, with ``balance=``.
      devices: the data-parallel devices; must divide the step's rows.
      steps: only the first ``steps`` steps (default: all).
    """
    if not isinstance(packed, Packed) or packed.step_rows is None:
        raise ValueError(
            "step_balance takes a pack balanced by cost: meshfeed.pack(..., balance=, step_rows=)."
        )
    rows = int(packed.step_rows)
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1 or rows % devices:
        raise ValueError(
            f"devices={devices!r} must be an int >= 1 dividing the {rows} rows a step."
        )
    count = len(packed) // rows if steps is None else min(int(steps), len(packed) // rows)
    ids = np.arange(count * rows)
    costs = packed.row_costs(ids).reshape(count, rows)
    tokens = packed.row_tokens(ids).reshape(count, rows)
    loads = np.take_along_axis(costs, arrange(costs, devices), axis=1)
    loads = loads.reshape(count, devices, -1).sum(axis=2)
    means = loads.mean(axis=1)
    imbalance = np.where(means > 0, loads.max(axis=1) / np.where(means > 0, means, 1), 1.0)
    padding = 1 - tokens.sum(axis=1) / (rows * packed.seq_len)
    return StepBalance(loads, imbalance, padding)
