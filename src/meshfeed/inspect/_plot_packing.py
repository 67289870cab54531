"""Packed rows as a picture (matplotlib, an optional extra): one bar per row, one colour
per document, padding left white."""

from __future__ import annotations

from pathlib import Path

from meshfeed.data._packed import Packed
from meshfeed.inspect._plot import picture_path, require_matplotlib


def plot_packing(packed: Packed, path: str | Path, *, rows: int = 8, dpi: int = 100) -> Path:
    """Draws the first ``rows`` rows of ``packed`` to ``path`` (PNG or SVG).

    Each document piece is a coloured span labelled with its document id; padding is
    white. The title gives the padding over all rows.
    """
    path = picture_path(path)
    if not isinstance(packed, Packed):
        raise TypeError(f"plot_packing takes meshfeed.pack's result, got {type(packed).__name__}.")
    matplotlib, Figure, Rectangle = require_matplotlib("plot_packing")
    shown = min(rows, len(packed))
    figure = Figure(figsize=(10, 0.45 * shown + 1.0), dpi=dpi)
    axes = figure.add_axes((0.08, 0.12, 0.9, 0.72))
    colours = matplotlib.colormaps["tab20"]
    for r in range(shown):
        at, top = 0, shown - 1 - r
        for doc, start, length in packed.pieces(r):
            colour = colours(doc % 20)
            axes.add_patch(Rectangle((at, top), length, 0.8, facecolor=colour, edgecolor="black"))
            if length > packed.seq_len / 25:  # room for a label
                label = f"{doc}" + (f"+{start}" if start else "")
                axes.text(at + length / 2, top + 0.4, label, ha="center", va="center", fontsize=7)
            at += length
    axes.set_xlim(0, packed.seq_len)
    axes.set_ylim(0, shown)
    axes.set_yticks([shown - 0.6 - r for r in range(shown)])
    axes.set_yticklabels([f"row {r}" for r in range(shown)], fontsize=8)
    axes.set_xlabel("token position in the row", fontsize=8)
    stats = packed.stats()
    figure.suptitle(
        f"{stats['documents']:,} documents packed into {stats['rows']:,} rows of "
        f"{packed.seq_len}: {100 * stats['padding_fraction']:.2f}% padding (white); colour "
        "= document, label = document id (+ start of a split piece)",
        fontsize=9,
    )
    figure.savefig(path, dpi=dpi)
    return path
