"""The packing plan: which piece of which document goes in which packed row.

Planned once, from the documents' lengths alone, so it is the same on every process
and needs no data. Documents are taken in a keyed shuffled order (``seed``) -- or in
their own order, for a source that must be read in order (a mixture with stages) -- and packed
in windows of ``window`` documents, each window on its own: no global sort, bounded
work per window, and windows could be planned in parallel. Within a window the pieces
fill rows by ``algorithm`` (``_pack_fill``): ``"best_fit"`` or ``"first_fit"`` as they
come, or ``"best_fit_decreasing"``, longest first, which pads least (on BERT's lengths
at a window of 16,384: 0.07% and 2.3%, where ``"best_fit"`` pads 0.75% and 5.8%) and
fills more the more a window holds, at no more time a document -- hence its own
default window (``WINDOWS``). Its rows come out longest piece first within a window,
which only a source read in order (no shuffle) sees. ``max_segments`` closes a row
once it holds that many pieces. A document longer than ``seq_len`` is cut into
``seq_len`` pieces (``"split"``), cut to its first ``seq_len`` tokens (``"truncate"``),
skipped (``"drop"``) or refused (``"error"``).

The plan is four arrays -- per piece its document, start and length, and where each
row's pieces start -- about 12 bytes a document.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator
from typing import Literal

import numpy as np

from meshfeed.core._permutation import Permutation
from meshfeed.data._pack_fill import best_fit, best_fit_decreasing, first_fit

Algorithm = Literal["best_fit", "first_fit", "best_fit_decreasing"]
"""How ``pack`` fills rows: each piece into the fullest row it fits (``best_fit``), or the
first (``first_fit``), as they come; or each window's pieces longest first, each into the
fullest row it fits (``best_fit_decreasing``)."""
LongDocs = Literal["split", "truncate", "drop", "error"]
"""What ``pack`` does with a document longer than ``seq_len``: split it into pieces,
truncate it, drop it, or raise."""
ALGORITHMS: tuple[Algorithm, ...] = ("best_fit", "first_fit", "best_fit_decreasing")
LONG_DOCS: tuple[LongDocs, ...] = ("split", "truncate", "drop", "error")
WINDOWS: dict[Algorithm, int] = {
    "best_fit": 16_384,
    "first_fit": 16_384,
    "best_fit_decreasing": 1 << 20,
}
"""Each algorithm's default ``window`` (documents planned together). ``best_fit_decreasing``
fills more the more a window holds, at no more time a document: its window holds a
fine-tuning set whole, where it makes as few rows as LPFHP (``_pack_fill``)."""
_COUNTS = (
    "documents",
    "empty_documents",
    "split_documents",
    "split_tokens",
    "truncated_documents",
    "truncated_tokens",
    "dropped_documents",
    "dropped_tokens",
)
"""What ``plan_windows`` counts into ``stats`` (``Packed.stats``), each from 0."""


class PackPlan:
    """Which piece of which document goes in which row: ``rows + 1`` row starts into
    the pieces, and per piece its document, its number in the document (piece ``k``
    starts at token ``k * seq_len``) and its length -- in the narrowest integer types
    that hold them."""

    def __init__(
        self,
        seq_len: int,
        doc: np.ndarray,
        piece: np.ndarray,
        length: np.ndarray,
        row_starts: np.ndarray,
    ) -> None:
        self.seq_len = seq_len
        self.doc = doc
        self.piece = piece
        self.length = length
        self.row_starts = row_starts

    @property
    def rows(self) -> int:
        """The number of packed rows."""
        return len(self.row_starts) - 1

    def start(self, pieces: np.ndarray) -> np.ndarray:
        """Where these pieces start in their documents."""
        return self.piece[pieces].astype(np.int64) * self.seq_len

    @property
    def tokens(self) -> int:
        """Tokens the rows hold."""
        return int(self.length.sum(dtype=np.int64))

    def pieces_of(self, rows: np.ndarray) -> tuple[np.ndarray, ...]:
        """The pieces of ``rows``, row after row: how many each row has, and per piece its
        document, its start in it and its length."""
        first, last = self.row_starts[rows], self.row_starts[rows + 1]
        count = (last - first).astype(np.int64)
        piece = np.repeat(first - np.cumsum(count) + count, count) + np.arange(count.sum())
        return count, self.doc[piece], self.start(piece), self.length[piece].astype(np.int64)

    def lengths_of(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """How many pieces each of ``rows`` has, and their lengths, row after row (a run
        of consecutive rows is a slice: nothing gathered)."""
        rows = np.asarray(rows, np.int64)
        first, last = self.row_starts[rows], self.row_starts[rows + 1]
        count = (last - first).astype(np.int64)
        if len(rows) and rows[-1] - rows[0] == len(rows) - 1 and (np.diff(rows) == 1).all():
            return count, self.length[first[0] : last[-1]].astype(np.int64)
        piece = np.repeat(first - np.cumsum(count) + count, count) + np.arange(count.sum())
        return count, self.length[piece].astype(np.int64)

    @property
    def nbytes(self) -> int:
        """Bytes the plan's arrays hold."""
        return sum(a.nbytes for a in (self.doc, self.piece, self.length, self.row_starts))

    def digest(self) -> str:
        """A hash of the plan, the same on every process; the loader's state carries it."""
        h = hashlib.sha256(str(self.seq_len).encode())
        for a in (self.doc, self.piece, self.length, self.row_starts):
            h.update(a.dtype.str.encode())  # the same lengths give the same types everywhere
            h.update(memoryview(np.ascontiguousarray(a)))  # type: ignore[arg-type]  # no copy
        return h.hexdigest()[:16]


def _pieces(
    docs: np.ndarray, lengths: np.ndarray, seq_len: int, long_docs: LongDocs, stats: dict
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pieces (document, piece number, length) of one window's documents, in order."""
    stats["empty_documents"] += int((lengths == 0).sum())
    keep = lengths > 0
    docs, lengths = docs[keep], lengths[keep]
    long = lengths > seq_len
    if long.any():
        if long_docs == "error":
            i = int(np.argmax(long))
            raise ValueError(
                f"document {int(docs[i])} has {int(lengths[i])} tokens, more than "
                f"seq_len={seq_len}, and long_docs='error'; pass long_docs='split' (cut it "
                "into pieces), 'truncate' or 'drop', or a larger seq_len."
            )
        if long_docs == "drop":
            stats["dropped_documents"] += int(long.sum())
            stats["dropped_tokens"] += int(lengths[long].sum())
            docs, lengths = docs[~long], lengths[~long]
        elif long_docs == "truncate":
            stats["truncated_documents"] += int(long.sum())
            stats["truncated_tokens"] += int((lengths[long] - seq_len).sum())
            lengths = np.minimum(lengths, seq_len)
        else:
            stats["split_documents"] += int(long.sum())
            stats["split_tokens"] += int(lengths[long].sum())
    stats["documents"] += len(docs)
    counts = -(-lengths // seq_len)  # pieces per document (1 unless split)
    doc = np.repeat(docs, counts)
    piece = np.arange(len(doc)) - np.repeat(np.cumsum(counts) - counts, counts)
    length = np.minimum(np.repeat(lengths, counts) - piece * seq_len, seq_len)
    return doc, piece, length


def _total_pieces(lengths: np.ndarray, seq_len: int, long_docs: LongDocs) -> int:
    """How many pieces the plan will hold (computed in chunks: no N-sized temporaries)."""
    total = 0
    for a in range(0, len(lengths), 1 << 16):
        chunk = lengths[a : a + (1 << 16)].astype(np.int64)
        chunk = chunk[chunk > 0]
        if long_docs == "split":
            total += int((-(-chunk // seq_len)).sum())
        elif long_docs == "drop":
            total += int((chunk <= seq_len).sum())
        else:
            total += len(chunk)
    return total


def narrowest(largest: int) -> type:
    """The narrowest of uint16, int32 and int64 that holds ``largest``."""
    for kind in (np.uint16, np.int32):
        if largest < np.iinfo(kind).max:
            return kind
    return np.int64


class Shape:
    """What a plan over ``lengths`` holds before it is made: its pieces, and the narrowest
    type of each of its arrays (the same wherever the same lengths are planned)."""

    def __init__(self, lengths: np.ndarray, seq_len: int, long_docs: LongDocs) -> None:
        n = len(lengths)
        self.pieces = _total_pieces(lengths, seq_len, long_docs)
        most_pieces = -(-int(lengths.max()) // seq_len) if n else 1
        self.doc = np.dtype(np.int32 if n < 2**31 else np.int64)
        self.piece = np.dtype(narrowest(most_pieces))
        self.length = np.dtype(narrowest(seq_len + 1))
        self.row_start = np.dtype(np.int32 if self.pieces < 2**31 else np.int64)


def plan_windows(
    lengths: np.ndarray,
    seq_len: int,
    *,
    seed: int,
    ordered: bool = False,
    algorithm: Algorithm,
    window: int,
    long_docs: LongDocs,
    max_segments: int | None,
    stats: dict[str, int],
    span: tuple[int, int] | None = None,
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """The plan a window of documents at a time: each window's pieces in row order (their
    documents, piece numbers and lengths) and its rows' piece counts; ``stats`` counts
    as it goes (see ``Packed.stats``). ``span``: only the windows of positions ``[a, b)``
    in the order (``a`` a multiple of ``window``), as a part of a build plans them."""
    n = len(lengths)
    a, b = span if span is not None else (0, n)
    stats.update(dict.fromkeys(_COUNTS, 0))
    order = (lambda docs: docs) if ordered else Permutation(n, seed=seed, epoch=0)
    for w in range(a, b, window):
        docs = order(np.arange(w, min(b, w + window)))
        doc, piece, length = _pieces(
            docs, lengths[docs].astype(np.int64), seq_len, long_docs, stats
        )
        placed, sizes = _rows(algorithm, length, seq_len, max_segments)
        yield doc[placed], piece[placed], length[placed], sizes


def _rows(
    algorithm: Algorithm, length: np.ndarray, seq_len: int, cap: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """One window's pieces in row order, and each row's piece count."""
    if algorithm == "best_fit_decreasing":
        return best_fit_decreasing(length, seq_len, cap)
    bins = (best_fit if algorithm == "best_fit" else first_fit)(length.tolist(), seq_len, cap)
    placed = np.fromiter(itertools.chain.from_iterable(bins), np.int64, len(length))
    return placed, np.fromiter((len(b) for b in bins), np.int32, len(bins))


def narrow_lengths(lengths: np.ndarray) -> np.ndarray:
    """``lengths`` in the narrowest type that holds them (the plan keeps them while it plans)."""
    return lengths.astype(narrowest(int(lengths.max()) if len(lengths) else 0), copy=False)


def no_tokens() -> ValueError:
    return ValueError("pack found no tokens to pack: every document is empty or was dropped.")


def plan_packing(
    lengths: np.ndarray,
    seq_len: int,
    *,
    seed: int,
    ordered: bool = False,
    algorithm: Algorithm,
    window: int,
    long_docs: LongDocs,
    max_segments: int | None,
) -> tuple[PackPlan, dict[str, int]]:
    """The plan for documents of ``lengths``, in memory, and its counts (see ``Packed.stats``)."""
    lengths = narrow_lengths(lengths)
    stats: dict[str, int] = {}
    # The plan's arrays are allocated once, at their final size and narrowest types.
    shape = Shape(lengths, seq_len, long_docs)
    doc_out = np.empty(shape.pieces, shape.doc)
    piece_out = np.empty(shape.pieces, shape.piece)
    length_out = np.empty(shape.pieces, shape.length)
    sizes: list[np.ndarray] = []
    at = 0
    windows = plan_windows(
        lengths,
        seq_len,
        seed=seed,
        ordered=ordered,
        algorithm=algorithm,
        window=window,
        long_docs=long_docs,
        max_segments=max_segments,
        stats=stats,
    )
    for doc, piece, length, counts in windows:
        end = at + len(doc)
        doc_out[at:end] = doc
        piece_out[at:end] = piece
        length_out[at:end] = length
        sizes.append(counts)
        at = end
    if not at:
        raise no_tokens()
    counts = np.concatenate(sizes)
    del sizes
    row_starts = np.zeros(len(counts) + 1, shape.row_start)
    np.cumsum(counts, out=row_starts[1:])
    return PackPlan(seq_len, doc_out, piece_out, length_out, row_starts), stats
