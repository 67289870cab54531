"""How a window's pieces fill rows: best fit and first fit as they come, best fit decreasing.

``best_fit`` puts each piece, in the window's order, in the open row it fills most
tightly (a sorted list of the rows' free space, searched with ``bisect``), ``first_fit``
in the first open row it fits; a row closes when full or at ``cap`` pieces. Kept plans
and loader states hold their rows, so they stay as they are.

``best_fit_decreasing`` takes the window's pieces longest first. Taken as they come, long
pieces come late and find the rows half full of short ones; longest first, the short
ones come last and fill the gaps. On the length histograms of Graphcore's packing paper
(arXiv 2107.02027: BERT pretraining on Wikipedia at 512 tokens, SQuAD 1.1 at 384;
``benchmarks/packing_fill.py``, 10^6 documents drawn from each) it fills 99.93% / 97.69%
of the tokens at a window of 16,384 documents, where ``best_fit`` fills 99.25% / 94.19%.
The paper's best packer, LPFHP, is the same rule on the whole set's histogram, so a
window that holds the set makes its number of rows: 97.74% on SQuAD, and 99.95% on
Wikipedia where LPFHP, at its published 12 sequences a row, fills 99.81% (99.81% too
with ``max_segments=12``). It is made a run of one length at a time
(``tightest_decreasing``), so the work grows with the distinct lengths and free spaces,
not the documents: about 0.5 us a document at a window of 2^20, where ``best_fit``'s
sorted list costs a document more the larger the window.

A ``max_segments`` that binds turns the order against it: the short pieces, last, find
every row full or at the cap and fill rows of their own (web-like lengths at 8,192
tokens and 16 a row: 17% padding; ``best_fit`` 1%). So with a cap each window is packed
by the same rule with its pieces as they come too (``tightest_as_they_come``, about
1.5 us a document at any window), and keeps those rows where they are fewer.
"""

from __future__ import annotations

import bisect
import itertools

import numpy as np


def best_fit(lengths: list[int], seq_len: int, cap: int | None) -> list[list[int]]:
    """Bins of piece indices: each piece into the open bin it fills most tightly."""
    shift = 1 << 32  # (remaining, bin) as one int: remaining * shift + bin, sorted
    free: list[int] = []
    bins: list[list[int]] = []
    for i, n in enumerate(lengths):
        j = bisect.bisect_left(free, n * shift)
        if j < len(free):
            key = free.pop(j)
            b, remaining = key % shift, key // shift - n
            bins[b].append(i)
        else:
            b, remaining = len(bins), seq_len - n
            bins.append([i])
        if remaining > 0 and (cap is None or len(bins[b]) < cap):
            bisect.insort(free, remaining * shift + b)
    return bins


def first_fit(lengths: list[int], seq_len: int, cap: int | None) -> list[list[int]]:
    """Bins of piece indices: each piece into the first open bin it fits."""
    remaining = np.full(max(1, len(lengths)), -1, np.int64)
    bins: list[list[int]] = []
    for i, n in enumerate(lengths):
        fits = remaining[: len(bins)] >= n
        b = int(np.argmax(fits)) if len(bins) and fits.any() else len(bins)
        if b == len(bins):
            bins.append([])
            remaining[b] = seq_len
        bins[b].append(i)
        remaining[b] -= n
        if cap is not None and len(bins[b]) >= cap:
            remaining[b] = -1
    return bins


def best_fit_decreasing(
    lengths: np.ndarray, seq_len: int, cap: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """Rows of one window's pieces longest first, each into the open row it fills most
    tightly (with a cap, the rows of the pieces as they come where fewer): the pieces in
    row order and each row's count."""
    longest_first = tightest_decreasing(lengths, seq_len, cap)
    if cap is not None:  # a cap that binds can make it pad more (the module docstring)
        as_they_come = tightest_as_they_come(lengths.tolist(), seq_len, cap)
        if len(as_they_come[1]) < len(longest_first[1]):
            return as_they_come
    return longest_first


def tightest_decreasing(
    lengths: np.ndarray, seq_len: int, cap: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """Rows of pieces taken longest first (ties in their order), each into the open row
    it fills most tightly: the pieces in row order (each row's longest first) and each
    row's count.

    The rows of placing the pieces one at a time -- each into the open row of least free
    space that holds it, among those (with ``cap``) the one of fewest pieces, among those
    the one that came to that state last -- but made a length at a time. An open row is
    a key (its free space, then its pieces), the keys in use a sorted list searched with
    ``bisect``, each with a stack of its rows. While ``m`` pieces of length ``L`` are
    left, the rows of the least key that holds ``L`` each take
    ``t = min(space // L, cap - pieces)`` of them in one step, the last to come first:
    one at a time, each piece after a row's first would go into the row the one before
    left tightest -- the same row -- until it holds ``t``. So the steps grow with the
    distinct lengths and keys, not the pieces.
    """
    lengths = lengths.astype(np.int64, copy=False)  # negated below: no unsigned wrap
    order = np.argsort(-lengths, kind="stable")
    ordered = lengths[order]
    bounds = np.flatnonzero(np.diff(ordered, prepend=-1, append=-1)).tolist()
    stride = 1 if cap is None else cap + 1  # key = space * stride + pieces (with a cap)
    keys: list[int] = []  # the keys of open rows, ascending
    stacks: dict[int, list[int]] = {}  # key -> its open rows, the last to come last
    row_of = np.empty(len(lengths), np.int64)  # per piece in ``order``: its row
    rows = 0

    def push(space: int, pieces: int, ids: list[int]) -> None:
        key = space * stride + (0 if cap is None else pieces)
        if key not in stacks:
            bisect.insort(keys, key)
            stacks[key] = []
        stacks[key].extend(ids)

    for a, b in itertools.pairwise(bounds):
        size = int(ordered[a])
        while a < b:
            j = bisect.bisect_left(keys, size * stride)
            stack = stacks[keys[j]] if j < len(keys) else None
            space, pieces = divmod(keys[j], stride) if stack is not None else (seq_len, 0)
            take = space // size if cap is None else min(space // size, cap - pieces)
            count = min(b - a, take * len(stack)) if stack is not None else b - a
            used = -(-count // take)
            if stack is not None:  # the rows that came to this key last
                top = stack[len(stack) - used :][::-1]
                del stack[len(stack) - used :]
                if not stack:
                    del stacks[keys[j]], keys[j]
            else:  # none holds it: new rows
                top = list(range(rows, rows + used))
                rows += used
            ids = np.array(top, np.int64)
            row_of[a : a + count] = ids if take == 1 else np.repeat(ids, take)[:count]
            a += count
            full = count // take  # rows that took ``take``; the last may take fewer
            if full and space > take * size and (cap is None or pieces + take < cap):
                push(space - take * size, pieces + take, top[:full])
            if full < used:
                push(space - (count - full * take) * size, pieces + count - full * take, top[full:])
    placed = np.argsort(row_of, kind="stable")  # by row, each row's pieces longest first
    return order[placed], np.bincount(row_of, minlength=rows).astype(np.int32)


def tightest_as_they_come(
    lengths: list[int], seq_len: int, cap: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """``tightest_decreasing``'s rows with the pieces in their order in the window, one
    at a time (runs of one length are rare then): the same work a piece at any window."""
    stride = 1 if cap is None else cap + 1
    keys: list[int] = []
    stacks: dict[int, list[int]] = {}
    row_of: list[int] = []
    rows = 0
    for n in lengths:
        j = bisect.bisect_left(keys, n * stride)
        if j < len(keys):
            key = keys[j]
            stack = stacks[key]
            row = stack.pop()
            if not stack:
                del stacks[key], keys[j]
            space, pieces = divmod(key, stride)
        else:
            row, space, pieces = rows, seq_len, 0
            rows += 1
        row_of.append(row)
        space, pieces = space - n, pieces + 1
        if space > 0 and (cap is None or pieces < cap):
            key = space * stride + (0 if cap is None else pieces)
            if key not in stacks:
                bisect.insort(keys, key)
                stacks[key] = []
            stacks[key].append(row)
    rows_of = np.array(row_of, np.int64)
    return np.argsort(rows_of, kind="stable"), np.bincount(rows_of, minlength=rows).astype(np.int32)
