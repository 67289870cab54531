"""Packing fill: meshfeed's planner against Graphcore's histogram packers on BERT's lengths.

A first line per histogram packs the published one by SPFHP and LPFHP, to check them against
the paper's figures (arXiv 2107.02027; Wikipedia: 99.6040% and 99.8129%).
"""

from __future__ import annotations

import json
import platform
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from harness import arguments
from packing import source

import meshfeed

HISTOGRAMS = Path(__file__).parent / "data" / "graphcore_histograms.json"
SETS = {"wikipedia": "wikipedia", "squad": "squad_1_1"}
THEIR_CAP = 12  # max_sequences_per_pack in the paper's README
BEST_FIT_WINDOW = 16_384  # pack's default window
Patterns = list[tuple[int, tuple[int, ...]]]  # (how many rows, the lengths in each)
Rows = dict[int, Patterns]  # by free space; closed rows (full, or at the cap) under 0


def spfhp(counts: np.ndarray, seq_len: int, cap: int) -> Patterns:
    """Shortest-pack-first histogram packing: lengths longest first, each into the open rows
    (groups of identical rows by free space) of the *most* free space that hold it, a group
    of ``k`` rows taking ``k`` sequences, one each; sequences that fit nowhere open new rows
    (one each). A row closes when full or at ``cap`` sequences."""
    open_rows: Rows = defaultdict(list)
    for length in range(seq_len, 0, -1):
        n = int(counts[length - 1])
        free = seq_len
        while n and free >= length:
            groups = open_rows.get(free)
            if not groups:
                free -= 1
                continue
            k, rows = groups.pop()
            took = min(k, n)
            if k > took:
                groups.append((k - took, rows))
            n -= took
            _keep(open_rows, took, (*rows, length), free - length, cap)
        if n:
            _keep(open_rows, n, (length,), seq_len - length, cap)
    return [g for groups in open_rows.values() for g in groups]


def lpfhp(counts: np.ndarray, seq_len: int, cap: int) -> Patterns:
    """Longest-pack-first histogram packing: lengths longest first, each into the open rows
    of the *least* free space that hold it, each row taking as many copies as fit (within
    ``cap`` and the sequences left), the search starting again at the tightest after each
    step; sequences that fit nowhere open new rows of as many copies as fit."""
    open_rows: Rows = defaultdict(list)
    for length in range(seq_len, 0, -1):
        n = int(counts[length - 1])
        free = length
        while n:
            if free > seq_len:  # fits in no open row
                repeat = min(seq_len // length, cap, n)
                rows = n // repeat
                _keep(open_rows, rows, (length,) * repeat, seq_len - repeat * length, cap)
                n -= rows * repeat
                continue
            groups = open_rows.get(free)
            if not groups:
                free += 1
                continue
            k, pattern = groups.pop()
            repeat = min(free // length, cap - len(pattern), n)
            took = min(k, n // repeat)
            if k > took:
                groups.append((k - took, pattern))
            n -= took * repeat
            _keep(open_rows, took, (*pattern, *(length,) * repeat), free - repeat * length, cap)
            free = length
    return [g for groups in open_rows.values() for g in groups]


def _keep(open_rows: Rows, k: int, rows: tuple[int, ...], free: int, cap: int) -> None:
    """``k`` rows of ``rows`` under their free space, or closed at ``cap`` sequences."""
    open_rows[0 if len(rows) >= cap else free].append((k, rows))


def patterns_fill(patterns: Patterns, seq_len: int) -> tuple[float, int, int]:
    """Real-token fraction, rows and sequences of ``patterns``."""
    rows = sum(k for k, _ in patterns)
    tokens = sum(k * sum(p) for k, p in patterns)
    return tokens / (rows * seq_len), rows, sum(k * len(p) for k, p in patterns)


PACKERS: dict[str, Callable[[np.ndarray, int, int], Patterns]] = {"spfhp": spfhp, "lpfhp": lpfhp}


def fills(name: str, documents: int, windows: tuple[int, ...]) -> Iterator[dict[str, object]]:
    """The lines for one histogram: the published one packed by SPFHP and LPFHP, then
    ``documents`` drawn from it (seeded), packed by every entry."""
    histogram = json.loads(HISTOGRAMS.read_text())[SETS[name]]
    counts = np.asarray(histogram["counts"], np.int64)  # counts[i]: sequences of i + 1 tokens
    seq_len = int(histogram["max_sequence_length"])  # what they were cut at
    at = {"histogram": name, "seq_len": seq_len}
    published = {"documents": int(counts.sum()), "max_sequences_per_pack": THEIR_CAP}
    for label, packer in PACKERS.items():
        patterns = packer(counts, seq_len, THEIR_CAP)
        published[f"{label}_fill"] = round(patterns_fill(patterns, seq_len)[0], 6)
    yield {"name": "published_histogram", **at, **published}
    rng = np.random.default_rng(0)
    lengths = rng.choice(np.arange(1, len(counts) + 1), documents, p=counts / counts.sum())
    entries: list[tuple[str, int | None, int | None]] = [(p, None, THEIR_CAP) for p in PACKERS]
    for cap in (None, THEIR_CAP):
        entries.append(("best_fit", BEST_FIT_WINDOW, cap))
        entries += [("best_fit_decreasing", w, cap) for w in windows]
    documents_source = source(lengths)
    for algorithm, window, cap in entries:
        start = time.perf_counter()
        if algorithm == "best_fit" or algorithm == "best_fit_decreasing":
            packed = meshfeed.pack(
                documents_source, seq_len, algorithm=algorithm, window=window, max_segments=cap
            )
            seconds = time.perf_counter() - start
            fill, rows = 1 - packed.stats()["padding_fraction"], len(packed)
        else:  # theirs run on the histogram, at once: their time is to the rows' patterns
            drawn = np.bincount(lengths, minlength=seq_len + 1)[1:]
            patterns = PACKERS[algorithm](drawn, seq_len, THEIR_CAP)
            seconds = time.perf_counter() - start
            fill, rows, sequences = patterns_fill(patterns, seq_len)
            assert sequences == documents, "every sequence packed once"
        figures = {"real_token_fraction": round(fill, 6), "rows": rows}
        figures["us_per_document"] = round(seconds / documents * 1e6, 3)
        entry = {"algorithm": algorithm, "window": window, "max_segments": cap}
        yield {"name": "fill", **at, "documents": documents, **entry, **figures}


def main() -> None:
    args = arguments(__doc__)
    documents = 20_000 if args.smoke else 1_000_000
    windows = (16_384, 65_536) if args.smoke else (16_384, 65_536, 262_144, 1_048_576)
    common = {"benchmark": "packing_fill", "smoke": args.smoke, "python": platform.python_version()}
    for name in SETS:
        for line in fills(name, documents, windows):
            print(json.dumps({**common, **line}), flush=True)


if __name__ == "__main__":
    main()
