"""The peers' balancing rules for ``balance.py``, written out from their sources: each
forms a step's ``G = D * r`` rows, ``r`` for each of ``D`` devices, from a buffer of lengths."""

from __future__ import annotations

import heapq
import itertools
from typing import NamedTuple

import numpy as np

ALPHA = 24576
"""verl's and slime's linear coefficient: ``24576 L + L^2`` (FLOPs of a 7B, ``h = 4096``)."""


class Step(NamedTuple):
    row: np.ndarray  # per sequence: its row in the step, -1 left out (carried)
    device: np.ndarray  # per row: its device
    capacity: int  # tokens a row holds (T; r T for a rule that forms no rows)


def karmarkar_karp(values: np.ndarray, k: int, equal_size: bool = False) -> np.ndarray:
    """verl's and tunix's largest differencing method (ties by age): per value its group of
    ``k``, largest sum first; ``equal_size``: ``len(values) / k`` values each."""
    values = np.asarray(values, np.float64)
    n = len(values)
    if k <= 1 or n <= 1:
        return np.zeros(n, np.int64)
    parent = np.arange(n)  # union-find over the values: a group is a root
    tick = itertools.count()
    heap: list[tuple[float, int, object]] = []
    by_value = np.argsort(values, kind="stable")
    if equal_size:
        if n % k:
            raise ValueError(f"equal_size needs len(values) % k == 0, got {n} and {k}")
        for chunk in by_value.reshape(-1, k):
            state = _State(values[chunk], chunk.copy())  # ascending
            heapq.heappush(heap, (-state.spread(), next(tick), state))
    else:
        for i in by_value.tolist():
            heapq.heappush(heap, (-float(values[i]), next(tick), i))  # one value: its spread
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        if isinstance(a, int) and isinstance(b, int):
            merged = _State.pair(values, a, b, k)
        elif isinstance(a, int) or isinstance(b, int):
            one, merged = (a, b) if isinstance(a, int) else (b, a)
            merged.add(float(values[one]), one, parent)  # type: ignore[union-attr]
        else:
            merged = a.merge(b, parent)  # type: ignore[union-attr]
        heapq.heappush(heap, (-merged.spread(), next(tick), merged))  # type: ignore[union-attr]
    last = heap[0][2]
    while not np.array_equal(parent[parent], parent):  # every value to its root
        parent = parent[parent]
    group_of_root = np.full(n, -1, np.int64)
    roots = last.roots[::-1]  # type: ignore[union-attr]  # groups by sum, largest first
    group_of_root[roots[roots >= 0]] = np.flatnonzero(roots >= 0)
    return group_of_root[parent]


class _State:
    """``k`` sums, ascending, and per sum the root of its values (-1: none)."""

    __slots__ = ("roots", "sums")

    def __init__(self, sums: np.ndarray, roots: np.ndarray) -> None:
        self.sums, self.roots = sums, roots

    @classmethod
    def pair(cls, values: np.ndarray, a: int, b: int, k: int) -> _State:
        sums, roots = np.zeros(k), np.full(k, -1, np.int64)
        low, high = (a, b) if values[a] <= values[b] else (b, a)
        sums[-2:], roots[-2:] = (values[low], values[high]), (low, high)
        return cls(sums, roots)

    def spread(self) -> float:
        return float(self.sums[-1] - self.sums[0])

    def add(self, value: float, i: int, parent: np.ndarray) -> None:
        """Value ``i`` joins the smallest sum."""
        sums, roots = self.sums, self.roots
        x, root = sums[0] + value, int(roots[0])
        if root < 0:
            root = i
        else:
            parent[i] = root
        j = int(sums[1:].searchsorted(x))  # keep the sums ascending
        sums[:j], roots[:j] = sums[1 : j + 1], roots[1 : j + 1]
        sums[j], roots[j] = x, root

    def merge(self, other: _State, parent: np.ndarray) -> _State:
        """This one's ``i``-th largest sum with ``other``'s ``i``-th smallest."""
        sums = self.sums[::-1] + other.sums
        a, b = self.roots[::-1], other.roots
        both = (a >= 0) & (b >= 0)
        parent[b[both]] = a[both]
        order = np.argsort(sums, kind="stable")
        return _State(sums[order], np.where(a >= 0, a, b)[order])


def tunix(lengths: np.ndarray, devices: int, per_device: int, seq_len: int) -> Step:
    """``balanced_pack`` of google/tunix PR #1665 (head 4e62b75d): Karmarkar-Karp on tokens
    into ``ceil(sum / T)`` packs up to a multiple of ``D``, raised by ``D`` until each fits
    ``T``; packs largest first in chunks of ``D``, the first ``r`` the step."""
    n = len(lengths)
    k = -(-int(lengths.sum()) // seq_len)
    k = min(-(-k // devices) * devices, n)
    while True:
        group = karmarkar_karp(lengths, k)
        fits = np.bincount(group, lengths, minlength=k).max() <= seq_len
        if k >= n or fits:
            break
        k = min(n, k + devices)
    rows = devices * per_device
    return Step(np.where(group < rows, group, -1), np.arange(rows) % devices, seq_len)


def trl(lengths: np.ndarray, devices: int, per_device: int, seq_len: int) -> Step:
    """``_balance_by_squared_length`` of TRL's async GRPO trainer: longest first onto the
    device of least ``sum L^2`` (ties: the lowest); no token cap."""
    row = np.empty(len(lengths), np.int64)
    loads = [(0, d) for d in range(devices)]  # (sum L^2, device): the least, then the lowest
    for i in np.argsort(-lengths, kind="stable").tolist():
        load, d = heapq.heappop(loads)
        row[i] = d
        heapq.heappush(loads, (load + int(lengths[i]) ** 2, d))
    return Step(row, np.arange(devices), per_device * seq_len)


def torchtitan(lengths: np.ndarray, devices: int, per_device: int, seq_len: int) -> Step:
    """``_assign_training_samples_to_rows`` of pytorch/torchtitan PR #3938 (head ddf65c8d):
    longest first into the row of least ``sum L^2`` with room; the first with no room
    closes the step (the rest carried); rows to devices ``chunk[rank::D]``."""
    rows = devices * per_device
    room = np.full(rows, seq_len, np.int64)
    cost = np.zeros(rows, np.float64)
    row = np.full(len(lengths), -1, np.int64)
    for i in np.argsort(-lengths, kind="stable").tolist():
        n = int(lengths[i])
        fits = room >= n
        if not fits.any():
            break
        best = int(np.argmin(np.where(fits, cost, np.inf)))  # the first of the least
        row[i] = best
        room[best] -= n
        cost[best] += n * n
    return Step(row, np.arange(rows) % devices, seq_len)


def slime(lengths: np.ndarray, devices: int, per_device: int, seq_len: int) -> Step:
    """``build_dp_schedule`` of THUDM/slime, ``--balance-by-flops``: Karmarkar-Karp on
    ``alpha L + L^2`` into ``ceil(sum / T)`` micro-batches (no cap), raised to a multiple
    of ``D`` by splitting the largest, dealt to devices by Karmarkar-Karp, equal counts."""
    n = len(lengths)
    mbs = max(1, -(-int(lengths.sum()) // seq_len))
    workload = ALPHA * lengths.astype(np.float64) + lengths.astype(np.float64) ** 2
    group = np.arange(n) if mbs >= n else karmarkar_karp(workload, mbs)
    order = np.argsort(group, kind="stable")
    split = np.split(order, np.cumsum(np.bincount(group, minlength=min(n, mbs)))[:-1])
    bins = [g.tolist() for g in split]
    target = max(-(-len(bins) // devices) * devices, devices)
    _split_largest(bins, target, lengths)
    bins += [[] for _ in range(-len(bins) % devices)]  # too few to split: empty micro-batches
    weights = np.array([workload[b].sum() if b else 0.0 for b in bins])
    rank = karmarkar_karp(weights, devices, equal_size=True)
    order = np.argsort(rank, kind="stable")  # micro-batches rank after rank
    row = np.full(n, -1, np.int64)
    for r, b in enumerate(order):
        row[bins[b]] = r
    return Step(row, rank[order], seq_len)


def _split_largest(bins: list[list[int]], target: int, lengths: np.ndarray) -> None:
    """slime's ``expand_bins_by_splitting``: the bin of most tokens (of two or more) split
    in halves (longest first onto the lighter), until there are ``target``."""
    while len(bins) < target:
        many = [(int(lengths[b].sum()), j) for j, b in enumerate(bins) if len(b) > 1]
        if not many:
            return
        _, j = max(many)
        halves: list[list[int]] = [[], []]
        sums = [0, 0]
        for i in sorted(bins[j], key=lambda i: -int(lengths[i])):
            h = 0 if sums[0] <= sums[1] else 1
            halves[h].append(i)
            sums[h] += int(lengths[i])
        bins[j] = halves[0]
        bins.append(halves[1])


RULES = {"tunix": tunix, "trl": trl, "torchtitan": torchtitan, "slime": slime}
"""The peers' rules by name; each ``rule(lengths, devices, per_device, seq_len) -> Step``."""
FILL = {"tunix": "under", "trl": "under", "torchtitan": "over", "slime": "under"}
"""The buffer each does best with: at most ``G T`` tokens (tunix's packs need the slack),
or at least (torchtitan fills every row and carries the rest)."""
