"""Packing fill: meshfeed's planner against Graphcore's histogram packers on BERT's lengths.

Documents drawn (seeded) from the length histograms Graphcore's packing paper (arXiv
2107.02027) publishes for BERT's Wikipedia at 512 and SQuAD 1.1 at 384
(``data/graphcore_histograms.json``, MIT), packed by ``meshfeed.pack``'s ``best_fit``
and ``best_fit_decreasing`` (several windows; with no cap and ``max_segments=12``) and
by SPFHP and LPFHP written out from the paper (``max_sequences_per_pack=12``, on the
histogram at once: their time is to the rows' patterns). Real-token fraction and plan
time a document; a first line per histogram checks the code below against the paper's
figures on the published histogram (Wikipedia: 99.6040% and 99.8129%). ``--smoke`` for
CI (20k documents, two windows).
"""

from __future__ import annotations

import json
import platform
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np
from harness import arguments

import meshfeed
from meshfeed.types import Algorithm

HISTOGRAMS = Path(__file__).parent / "data" / "graphcore_histograms.json"
SETS = {"wikipedia": "wikipedia", "squad": "squad_1_1"}
THEIR_CAP = 12  # max_sequences_per_pack in the paper's README
BEST_FIT_WINDOW = 16_384  # pack's default window
Patterns = list[tuple[int, tuple[int, ...]]]  # (how many rows, the lengths in each)


def histogram(name: str) -> tuple[np.ndarray, int]:
    """The published counts per length (``counts[i]``: sequences of ``i + 1`` tokens)
    and the sequence length they were cut at."""
    entry = json.loads(HISTOGRAMS.read_text())[SETS[name]]
    return np.asarray(entry["counts"], np.int64), int(entry["max_sequence_length"])


def draw(counts: np.ndarray, n: int, seed: int) -> np.ndarray:
    """``n`` document lengths drawn from ``counts``."""
    rng = np.random.default_rng(seed)
    return rng.choice(np.arange(1, len(counts) + 1), n, p=counts / counts.sum())


def spfhp(counts: np.ndarray, seq_len: int, cap: int) -> Patterns:
    """Shortest-pack-first histogram packing: lengths longest first; the open rows kept
    as groups of identical rows (count, lengths) by their free space; each length goes
    into the open rows of the *most* free space that hold it, a group of ``k`` rows
    taking ``k`` sequences, one each (the rest of a group stays open as a smaller
    group); sequences that fit nowhere open new rows, one each. A row closes when full
    or at ``cap`` sequences."""
    open_rows: dict[int, list[tuple[int, tuple[int, ...]]]] = defaultdict(list)
    closed: Patterns = []
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
            elif not groups:
                del open_rows[free]
            n -= took
            _keep(open_rows, closed, took, (*rows, length), free - length, cap)
        if n:
            _keep(open_rows, closed, n, (length,), seq_len - length, cap)
    return closed + [g for groups in open_rows.values() for g in groups]


def lpfhp(counts: np.ndarray, seq_len: int, cap: int) -> Patterns:
    """Longest-pack-first histogram packing: lengths longest first; the open rows kept as
    groups (count, lengths) by their free space; each length goes into the open rows of
    the *least* free space that hold it (best fit), each row taking as many copies of it
    as fit (``free // length``, within ``cap`` and the sequences left) -- as many rows
    of the group as there are sequences for; the search starts again at the tightest
    after each step. Sequences that fit nowhere open new rows of as many copies as fit."""
    open_rows: dict[int, list[tuple[int, tuple[int, ...]]]] = defaultdict(list)
    closed: Patterns = []
    for length in range(seq_len, 0, -1):
        n = int(counts[length - 1])
        free = length
        while n:
            if free > seq_len:  # fits in no open row
                repeat = min(seq_len // length, cap, n)
                rows = n // repeat
                _keep(open_rows, closed, rows, (length,) * repeat, seq_len - repeat * length, cap)
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
            elif not groups:
                del open_rows[free]
            n -= took * repeat
            new = (*pattern, *(length,) * repeat)
            _keep(open_rows, closed, took, new, free - repeat * length, cap)
            free = length
    return closed + [g for groups in open_rows.values() for g in groups]


def _keep(
    open_rows: dict[int, list[tuple[int, tuple[int, ...]]]],
    closed: Patterns,
    k: int,
    rows: tuple[int, ...],
    free: int,
    cap: int,
) -> None:
    """``k`` rows of ``rows``: closed when full or at ``cap`` sequences, else open."""
    if free == 0 or len(rows) >= cap:
        closed.append((k, rows))
    else:
        open_rows[free].append((k, rows))


def patterns_fill(patterns: Patterns, seq_len: int) -> tuple[float, int, int]:
    """Real-token fraction, rows and sequences of ``patterns``."""
    rows = sum(k for k, _ in patterns)
    tokens = sum(k * sum(p) for k, p in patterns)
    return tokens / (rows * seq_len), rows, sum(k * len(p) for k, p in patterns)


def theirs(
    packer: Callable[[np.ndarray, int, int], Patterns], lengths: np.ndarray, seq_len: int
) -> dict[str, float]:
    start = time.perf_counter()
    counts = np.bincount(lengths, minlength=seq_len + 1)[1:]
    patterns = packer(counts, seq_len, THEIR_CAP)
    seconds = time.perf_counter() - start
    fill, rows, sequences = patterns_fill(patterns, seq_len)
    assert sequences == len(lengths), "every sequence packed once"
    return {"fill": fill, "rows": rows, "seconds": seconds}


def ours(
    lengths: np.ndarray, seq_len: int, algorithm: Algorithm, window: int, max_segments: int | None
) -> dict[str, float]:
    """``meshfeed.pack`` over documents of ``lengths`` (their tokens a zero-byte view:
    planning reads the lengths alone)."""
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = np.broadcast_to(np.zeros(1, np.uint8), (int(offsets[-1]),))
    source = meshfeed.ArraySource({"tokens": meshfeed.Ragged(tokens, offsets)})
    start = time.perf_counter()
    packed = meshfeed.pack(
        source, seq_len, algorithm=algorithm, window=window, max_segments=max_segments
    )
    seconds = time.perf_counter() - start
    fill = 1 - packed.stats()["padding_fraction"]
    return {"fill": fill, "rows": len(packed), "seconds": seconds}


def fills(name: str, documents: int, windows: tuple[int, ...]) -> list[dict[str, object]]:
    """The lines for one histogram: the published one packed by SPFHP and LPFHP, then
    ``documents`` drawn from it, packed by every entry."""
    counts, seq_len = histogram(name)
    published = {
        f"{label}_fill": round(patterns_fill(packer(counts, seq_len, THEIR_CAP), seq_len)[0], 6)
        for label, packer in (("spfhp", spfhp), ("lpfhp", lpfhp))
    }
    lines: list[dict[str, object]] = [
        {
            "name": "published_histogram",
            "histogram": name,
            "seq_len": seq_len,
            "documents": int(counts.sum()),
            "max_sequences_per_pack": THEIR_CAP,
            **published,
        }
    ]
    lengths = draw(counts, documents, seed=0)
    entries: list[tuple[str, int | None, int | None]] = [
        ("spfhp", None, THEIR_CAP),
        ("lpfhp", None, THEIR_CAP),
    ]
    for cap in (None, THEIR_CAP):
        entries.append(("best_fit", BEST_FIT_WINDOW, cap))
        entries += [("best_fit_decreasing", w, cap) for w in windows]
    for algorithm, window, cap in entries:
        if algorithm == "best_fit" or algorithm == "best_fit_decreasing":
            assert window is not None
            got = ours(lengths, seq_len, algorithm, window, cap)
        else:
            got = theirs(spfhp if algorithm == "spfhp" else lpfhp, lengths, seq_len)
        lines.append(
            {
                "name": "fill",
                "histogram": name,
                "seq_len": seq_len,
                "documents": documents,
                "algorithm": algorithm,
                "window": window,
                "max_segments": cap,
                "real_token_fraction": round(got["fill"], 6),
                "rows": got["rows"],
                "us_per_document": round(got["seconds"] / documents * 1e6, 3),
            }
        )
    return lines


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
