"""A tighter fill: ``algorithm="best_fit_decreasing"`` keeps every token once within
``seq_len`` and ``max_segments``, makes the rows of its one-at-a-time definition (the
same bytes on every run), pads less than ``best_fit`` on BERT's lengths, and reads back
the same from a kept plan."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

import meshfeed
import pack_fns
from meshfeed.core._permutation import Permutation
from meshfeed.data._pack_fill import tightest_as_they_come, tightest_decreasing
from meshfeed.data._pack_plan import Algorithm, plan_packing

HISTOGRAMS = Path(__file__).parents[2] / "benchmarks" / "data" / "graphcore_histograms.json"
BFD: Algorithm = "best_fit_decreasing"


def _one_at_a_time(
    lengths: list[int], seq_len: int, cap: int | None, decreasing: bool = True
) -> list[list[int]]:
    """The definition: pieces longest first (ties in order) or as they come, each into
    the open row of least free space that holds it, then (with a cap) fewest pieces,
    then the last to come to that state; a row closes when full or at ``cap`` pieces."""
    rows: list[list[int]] = []
    stacks: defaultdict[tuple[int, int], list[int]] = defaultdict(list)
    order = range(len(lengths))
    for i in sorted(order, key=lambda i: -lengths[i]) if decreasing else order:
        fits = [key for key, stack in stacks.items() if stack and key[0] >= lengths[i]]
        if fits:
            key = min(fits)
            row, free = stacks[key].pop(), key[0]
        else:
            row, free = len(rows), seq_len
            rows.append([])
        rows[row].append(i)
        free -= lengths[i]
        if free > 0 and (cap is None or len(rows[row]) < cap):
            stacks[(free, 0 if cap is None else len(rows[row]))].append(row)
    return rows


def _plan(lengths: np.ndarray, seq_len: int, **kwargs) -> meshfeed.sources.Packed:
    tokens = meshfeed.Ragged(np.zeros(int(lengths.sum()), np.int32),
                             np.concatenate([[0], np.cumsum(lengths)]))  # fmt: skip
    return meshfeed.pack(meshfeed.ArraySource({"tokens": tokens}), seq_len, **kwargs)


def _same_plan(a: meshfeed.sources.Packed, b: meshfeed.sources.Packed) -> None:
    """Every row's pieces (their count, documents, starts and lengths) are the same."""
    rows = np.arange(len(b))
    for x, y in zip(a.plan.pieces_of(rows), b.plan.pieces_of(rows), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("max_segments", [None, 3])
def test_every_token_once_within_seq_len_and_max_segments(max_segments):
    packed = pack_fns.packed(algorithm=BFD, max_segments=max_segments)
    rows = packed[np.arange(len(packed))]
    seen = pack_fns.check_rows(rows)  # segments and positions agree with the tokens
    assert len(seen) == len(set(seen)), "a token appears twice"
    every = {(i, p) for i, d in enumerate(pack_fns.documents()) for p in range(len(d))}
    assert set(seen) == every, "a token is missing"
    assert packed.stats()["split_documents"] > 0  # documents longer than a row were cut
    if max_segments is not None:
        assert rows["segment_ids"].max() == max_segments


@pytest.mark.parametrize("cap", [None, 1, 2, 5])
def test_the_rows_are_those_of_the_one_at_a_time_definition(cap):
    rng = np.random.default_rng(cap or 0)
    for trial in range(30):
        seq_len = int(rng.integers(1, 80))
        lengths = rng.integers(1, seq_len + 1, int(rng.integers(1, 400)))
        if trial % 2:  # few distinct lengths: long runs of one length
            lengths = rng.choice(lengths[:4], len(lengths))
        placed, counts = tightest_decreasing(lengths, seq_len, cap)
        got = [row.tolist() for row in np.split(placed, np.cumsum(counts)[:-1])]
        assert got == _one_at_a_time(lengths.tolist(), seq_len, cap)
        placed, counts = tightest_as_they_come(lengths.tolist(), seq_len, cap)  # a cap's other try
        got = [row.tolist() for row in np.split(placed, np.cumsum(counts)[:-1])]
        assert got == _one_at_a_time(lengths.tolist(), seq_len, cap, decreasing=False)


def test_the_plan_takes_each_window_in_the_keyed_order():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 100, 3000)
    plan, _ = plan_packing(lengths, 64, seed=3, algorithm=BFD, window=1000,
                           long_docs="split", max_segments=None)  # fmt: skip
    order = Permutation(len(lengths), seed=3, epoch=0)(np.arange(len(lengths)))
    want = []
    for w in range(0, 3000, 1000):  # each window on its own, documents cut in pieces
        docs = order[w : w + 1000]
        doc = np.repeat(docs, -(-lengths[docs] // 64))
        first = np.r_[True, doc[1:] != doc[:-1]]
        piece = np.arange(len(doc)) - np.maximum.accumulate(np.where(first, np.arange(len(doc)), 0))
        length = np.minimum(lengths[doc] - 64 * piece, 64)
        want += [[(int(doc[i]), int(piece[i])) for i in row]
                 for row in _one_at_a_time(length.tolist(), 64, None)]  # fmt: skip
    counts, doc, start, _ = plan.pieces_of(np.arange(plan.rows))
    pieces = list(zip(doc.tolist(), (start // 64).tolist(), strict=True))
    got = [pieces[a:b] for a, b in itertools.pairwise(np.r_[0, np.cumsum(counts)])]
    assert got == want


def test_a_cap_that_binds_pads_no_more_than_best_fit():
    # Web-like lengths, 16 a row at 8,192: taken longest first, the short ones would
    # come last to rows full or at the cap; the rows of the pieces as they come are kept.
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(6.0, 1.1, 20_000), 1, 8192).astype(np.int64)
    entries: list[tuple[Algorithm, int]] = [("best_fit", 16), (BFD, 16), (BFD, 64)]
    padding = {}
    for algorithm, cap in entries:
        plan, _ = plan_packing(lengths, 8192, seed=0, algorithm=algorithm, window=20_000,
                               long_docs="split", max_segments=cap)  # fmt: skip
        assert np.diff(plan.row_starts).max() <= cap
        padding[algorithm, cap] = plan.rows * 8192 - plan.tokens
    assert padding[BFD, 16] <= 1.01 * padding["best_fit", 16]
    assert padding[BFD, 64] < padding["best_fit", 16]  # a cap that binds less: its own rows
    _, counts = tightest_decreasing(lengths, 8192, 16)  # longest first alone, at 16
    assert len(counts) * 8192 - lengths.sum() > 10 * padding["best_fit", 16]


@pytest.mark.parametrize(
    ("max_segments", "digest"), [(None, "1f69a1d4a16b0c3a"), (12, "d5eda09f7028d82f")]
)
def test_the_same_lengths_give_the_same_plan_on_any_run(max_segments, digest):
    lengths = (np.arange(50_000, dtype=np.int64) * 7919) % 700 + 1
    a, stats_a = plan_packing(lengths, 512, seed=1, algorithm=BFD, window=16_384,
                              long_docs="split", max_segments=max_segments)  # fmt: skip
    b, stats_b = plan_packing(lengths.copy(), 512, seed=1, algorithm=BFD, window=16_384,
                              long_docs="split", max_segments=max_segments)  # fmt: skip
    assert stats_a == stats_b
    for x, y in zip((a.doc, a.piece, a.length, a.row_starts),
                    (b.doc, b.piece, b.length, b.row_starts), strict=True):  # fmt: skip
        assert x.dtype == y.dtype and np.array_equal(x, y)
    # Kept plans and loader states hold this digest: a change to the rows shows here.
    assert a.digest() == b.digest() == digest


@pytest.mark.parametrize(("name", "key"), [("wikipedia", "wikipedia"), ("squad", "squad_1_1")])
def test_it_pads_less_than_best_fit_on_berts_lengths(name, key):
    entry = json.loads(HISTOGRAMS.read_text())[key]
    counts, seq_len = np.asarray(entry["counts"]), entry["max_sequence_length"]
    lengths = np.random.default_rng(0).choice(
        np.arange(1, seq_len + 1), 20_000, p=counts / counts.sum()
    )
    fill = {}
    for algorithm in ("best_fit", BFD):
        packed = _plan(lengths, seq_len, algorithm=algorithm)
        fill[algorithm] = 1 - packed.stats()["padding_fraction"]
    assert fill[BFD] > fill["best_fit"]
    assert fill[BFD] > {"wikipedia": 0.999, "squad": 0.977}[name]


def test_pack_and_the_kept_plan_give_the_same_rows(tmp_path):
    rng = np.random.default_rng(0)
    docs = [np.full(k, i % 1000, np.int32) for i, k in enumerate(rng.integers(1, 300, 5_000))]
    meshfeed.write_source(tmp_path / "data", {"tokens": meshfeed.Ragged.from_list(docs)},
                          shard_size=1024)  # fmt: skip
    memory = meshfeed.pack(meshfeed.open_source(tmp_path / "data"), 256, algorithm=BFD,
                           window=1024, plan_dir=False)  # fmt: skip
    kept = meshfeed.pack(meshfeed.open_source(tmp_path / "data"), 256, algorithm=BFD, window=1024)
    assert (tmp_path / "data" / "meshfeed.pack").is_dir()
    assert len(kept) == len(memory) and kept.stats() == memory.stats()
    assert kept.fingerprint == memory.fingerprint
    _same_plan(kept, memory)
    assert kept.pieces(7) == memory.pieces(7)
    ids = rng.integers(0, len(memory), 200)
    got, want = kept[ids], memory[ids]
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
