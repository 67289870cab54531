"""Packed rows as a picture (matplotlib, an optional extra): one bar per row, one colour
per document, padding left white; for rows balanced by cost, each step's imbalance over
the devices beside its padding."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from meshfeed.data._packed import Packed
from meshfeed.inspect._plot import picture_path, require_matplotlib
from meshfeed.inspect._step_balance import step_balance


def plot_packing(
    packed: Packed, path: str | Path, *, rows: int = 8, devices: int = 8, dpi: int = 100
) -> Path:
    """Draws the first ``rows`` rows of ``packed`` to ``path`` (PNG or SVG).

    Each document piece is a coloured span labelled with its document id; padding is
    white. The title gives the padding over all rows. For rows balanced by cost
    (``pack(..., balance=, step_rows=)``) a second panel draws, for each step, its
    imbalance when dealt to ``devices`` data-parallel devices (the slowest device's cost
    over the mean) beside its padding.
    """
    path = picture_path(path)
    if not isinstance(packed, Packed):
        raise TypeError(f"plot_packing takes meshfeed.pack's result, got {type(packed).__name__}.")
    matplotlib, Figure, Rectangle = require_matplotlib("plot_packing")
    shown = min(rows, len(packed))
    steps = packed.step_rows is not None
    figure = Figure(figsize=(10, 0.45 * shown + (3.2 if steps else 1.0)), dpi=dpi)
    axes = figure.add_axes((0.08, 0.45, 0.9, 0.45) if steps else (0.08, 0.12, 0.9, 0.72))
    chosen = list(range(shown))
    if steps:  # served by cost, cheapest first: rows from cheap to dear
        _plot_steps(figure.add_axes((0.08, 0.08, 0.9, 0.25)), packed, devices)
        chosen = np.linspace(0, len(packed) - 1, shown).round().astype(int).tolist()
    colours = matplotlib.colormaps["tab20"]
    for r, row in enumerate(chosen):
        at = 0
        top = shown - 1 - r
        for doc, start, length in packed.pieces(row):
            colour = colours(doc % 20)
            axes.add_patch(Rectangle((at, top), length, 0.8, facecolor=colour, edgecolor="black"))
            if length > packed.seq_len / 25:  # room for a label
                label = f"{doc}" + (f"+{start}" if start else "")
                axes.text(at + length / 2, top + 0.4, label, ha="center", va="center", fontsize=7)
            at += length
    axes.set_xlim(0, packed.seq_len)
    axes.set_ylim(0, shown)
    axes.set_yticks([shown - 0.6 - r for r in range(shown)])
    axes.set_yticklabels([f"row {row}" for row in chosen], fontsize=8)
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


def _plot_steps(axes: Any, packed: Packed, devices: int) -> None:
    """Each step's imbalance over ``devices`` and its padding (at most 4,000 steps)."""
    figures = step_balance(packed, devices, steps=4000)
    steps = np.arange(len(figures.imbalance))
    axes.plot(steps, figures.imbalance, lw=0.8, label=f"imbalance over {devices} devices")
    axes.plot(steps, 1 + figures.padding, lw=0.8, label="1 + padding")
    axes.set_xlabel("step (in the order served; the loader shuffles the steps)", fontsize=8)
    axes.legend(fontsize=7)
