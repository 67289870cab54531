"""Balanced steps: rows of even cost in each step, and spread over the devices by cost.

The rows of a packing plan stay what they are; only which rows make a step, and which
device of the step takes which, follow their cost (``_row_cost``):

- ``step_order``: the plan's rows sorted by cost and cut into steps of ``step_rows``, so
  a step's rows cost about the same (empty rows, to make whole steps, spread over the
  cheapest). A step's
  place in an epoch is the loader's keyed shuffle of the steps, so no length curriculum
  appears: the mean cost of a step does not trend over the epoch. (The peers that
  re-plan every step -- Karmarkar-Karp over the step's sequences, longest-first onto the
  lightest device -- can only move whole sequences among the devices of one step; rows
  planned once, from the whole data, can pick steps whose rows already match.)
- ``arrange``: within a step, the rows dealt to the data-parallel devices by cost in a
  serpentine (the dearest to device 0, the next to 1, ..., back from the last), each
  device taking ``step_rows / devices`` rows. A pure function of the step's rows and
  the device count, so every process agrees without talking, and a step under another
  data-parallel size holds the same rows.
"""

from __future__ import annotations

import numpy as np

EMPTY = -1
"""The plan row of an empty row (all padding), which makes a last step whole."""


def step_order(costs: np.ndarray, step_rows: int) -> np.ndarray:
    """Served row -> plan row (``EMPTY`` for an empty one): the plan's rows by cost
    (ties by row), cut into steps of ``step_rows``, with the empty rows that make their
    count a multiple of ``step_rows`` spread over the cheapest steps, at most an eighth
    of a step each (all in one step would leave that step's devices idle: its
    imbalance ``G / (G - empty)``, which moved the mean over a few hundred steps by
    tenths; spread, they cost the epoch's time at most 0.04%, ``benchmarks/balance.py``)."""
    order = np.argsort(np.asarray(costs, np.float64), kind="stable").astype(np.int64)
    empty = (-len(order)) % step_rows
    steps = (len(order) + empty) // step_rows
    per = max(1, step_rows // 8, -(-empty // max(steps, 1)))
    held = np.clip(empty - per * np.arange(steps), 0, per)  # empty rows in each step
    out = np.full(steps * step_rows, EMPTY, np.int64)
    out[np.arange(steps * step_rows) % step_rows >= np.repeat(held, step_rows)] = order
    return out


def arrange(costs: np.ndarray, devices: int) -> np.ndarray:
    """The order of one step's rows in its batch (of each step's, for ``[steps, G]``
    costs): device ``d`` takes positions ``[d·G/D, (d+1)·G/D)``; rows dealt by cost,
    dearest first, in a serpentine (ties by position)."""
    costs = np.asarray(costs, np.float64)
    rows = costs.shape[-1]
    position = np.broadcast_to(np.arange(rows), costs.shape)
    if devices <= 1 or rows <= devices:
        return np.array(position, np.int64)
    per = rows // devices
    dearest = np.lexsort((position, -costs), axis=-1)  # dearest first, ties by position
    turn, at = np.divmod(np.arange(rows), devices)
    device = np.where(turn % 2 == 0, at, devices - 1 - at)  # 0..D-1, D-1..0, ...
    slot = np.broadcast_to(device * per + turn, costs.shape)  # the turn-th row a device takes
    out = np.empty(costs.shape, np.int64)
    np.put_along_axis(out, slot, dearest, axis=-1)
    return out


def imbalance(costs: np.ndarray, devices: int) -> float:
    """The slowest device's cost over the mean, for one step's rows in batch order."""
    loads = np.asarray(costs, np.float64).reshape(devices, -1).sum(axis=1)
    mean = loads.mean()
    return float(loads.max() / mean) if mean > 0 else 1.0
