"""Balanced steps over a packing plan: which plan row each served row is, kept as data.

``pack(..., balance=, step_rows=G)`` serves the plan's rows in the order
``_balance.step_order`` gives -- by cost, in steps of ``G`` -- so each run of ``G``
served rows is a step of rows that cost about the same. The order depends on the plan
and the cost model only, so like the plan it is made once: for a kept plan it is kept
beside it, ``<plan>/balance-<key>/`` (a meshfeed folder of the fields ``row``, ``int64``,
and ``cost``, ``float64``), and a step reads its ``G`` entries by range, costs and all:
dealing a step reads ``G`` numbers, and on a host's start nothing grows with the number
of rows. Hosts that make it at once write the same bytes. A cost model
given as a function has no name to key it by, so its order is made in memory.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from meshfeed.data._balance import step_order
from meshfeed.data._folder import MANIFEST, join, read_json
from meshfeed.data._pack_plan import PackPlan
from meshfeed.data._pack_store import StoredPlan
from meshfeed.data._row_cost import Balance, row_costs
from meshfeed.data._store import open_source
from meshfeed.data._writer import write_source

CHUNK = 1 << 16
"""Plan rows costed at a time while the order is made."""


class ServedRows:
    """Served row -> plan row (``-1``: empty) and its cost, in memory or read by range
    from a kept order."""

    def __init__(self, order: np.ndarray | Any, costs: np.ndarray | None = None) -> None:
        self._order = order
        self._costs = costs

    def __len__(self) -> int:
        return len(self._order)

    def plan_rows(self, ids: np.ndarray) -> np.ndarray:
        """The plan rows of served rows ``ids``."""
        if self._costs is not None:
            return self._order[ids]
        return np.asarray(self._order[np.asarray(ids, np.int64)]["row"], np.int64)

    def costs(self, ids: np.ndarray) -> np.ndarray:
        """The costs of served rows ``ids`` (0 for an empty row): kept with the order, so
        a step's dealing reads ``G`` numbers."""
        if self._costs is not None:
            return self._costs[ids]
        return np.asarray(self._order[np.asarray(ids, np.int64)]["cost"], np.float64)


def served_rows(
    plan: PackPlan | StoredPlan,
    balance: Balance,
    token_cost: float,
    step_rows: int,
    options: Mapping[str, Any] | None = None,
) -> ServedRows:
    """The served order of ``plan``'s rows under the cost model (module docstring)."""
    kept = isinstance(plan, StoredPlan) and not callable(balance)
    if not kept:
        return ServedRows(*_ordered(plan, balance, token_cost, step_rows))
    assert isinstance(plan, StoredPlan)
    settings = {"balance": balance, "token_cost": float(token_cost), "step_rows": step_rows}
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    folder = join(plan.where, f"balance-{key}")
    if read_json(join(folder, MANIFEST), options) is None:
        sys.stderr.write(
            f"meshfeed: ordering the {plan.rows:,} rows of {plan.where} by cost into {folder} "
            "(once: later opens, on any host, read it)\n"
        )
        order, costs = _ordered(plan, balance, token_cost, step_rows)
        try:
            write_source(
                folder,
                {"row": order, "cost": costs},
                shard_size=1 << 20,
                storage_options=options,
            )
        except ValueError:  # another host wrote it first: the same bytes
            if read_json(join(folder, MANIFEST), options) is None:
                raise
    return ServedRows(open_source(folder, storage_options=options))


def _ordered(
    plan: PackPlan | StoredPlan, balance: Balance, token_cost: float, step_rows: int
) -> tuple[np.ndarray, np.ndarray]:
    """The served order and each served row's cost."""
    costs = np.empty(plan.rows, np.float64)
    for a in range(0, plan.rows, CHUNK):
        rows = np.arange(a, min(plan.rows, a + CHUNK))
        counts, lengths = plan.lengths_of(rows)
        costs[a : a + len(rows)] = row_costs(counts, lengths, plan.seq_len, balance, token_cost)
    order = step_order(costs, step_rows)
    return order, np.where(order >= 0, costs[np.maximum(order, 0)], 0.0)
