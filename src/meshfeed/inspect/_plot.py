"""Layouts as pictures (matplotlib, an optional extra): ``show_sharding``'s grid, drawn.

Each block is a box labelled with the devices that hold it, coloured by the process that
owns them, so a layout that sends one replica group across processes stands out.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from meshfeed.inspect._show import Grid, grid, label, notes, title

_CELL_W, _CELL_H, _MARGIN_W, _MARGIN_H = 1.3, 0.75, 1.6, 1.4  # inches


def picture_path(path: str | Path) -> Path:
    """``path`` as a ``Path``; raises unless it names a PNG or an SVG."""
    path = Path(path)
    if path.suffix.lower() not in (".png", ".svg"):
        raise ValueError(f"path={str(path)!r} must end in .png or .svg.")
    return path


def require_matplotlib(caller: str) -> tuple[Any, Any, Any]:
    """``matplotlib``, its ``Figure`` and ``Rectangle``, or an error naming the extra.

    Pictures are drawn on a ``Figure`` of their own, never through pyplot, so the
    user's backend and open figures stay as they are.
    """
    try:
        import matplotlib
        from matplotlib.figure import Figure
        from matplotlib.patches import Rectangle
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"{caller} draws with matplotlib; pip install 'meshfeed[plot]'"
            " (from a clone: pip install -e '.[plot]')."
        ) from error
    return matplotlib, Figure, Rectangle


def figure_size(g: Grid) -> tuple[float, float]:
    """The figure's (width, height) in inches for a grid."""
    longest = max([len(title(g)), *(len(n) for n in notes(g))])
    return (
        max(_MARGIN_W + _CELL_W * len(g.columns) + 0.5, 0.075 * longest + 0.4),
        _MARGIN_H + _CELL_H * len(g.rows) + 0.25 * len(notes(g)),
    )


def plot_sharding(
    x: Any,
    path: str | Path,
    *,
    shape: Sequence[int] | None = None,
    processes: int | None = None,
    dpi: int = 100,
) -> Path:
    """Draws the layout of ``x`` to ``path`` (PNG or SVG, by the suffix).

    Args:
      x: a ``jax.Array``, or a ``Sharding`` together with ``shape``.
      path: where to write; ``.png`` or ``.svg``.
      shape: the global shape, when ``x`` is a sharding.
      processes: colour as if the devices were split, in order, over this many processes.
      dpi: resolution of a PNG.

    Returns:
      The path written.
    """
    path = picture_path(path)
    matplotlib, Figure, Rectangle = require_matplotlib("plot_sharding")

    g = grid(x, shape=shape, processes=processes)
    width, height = figure_size(g)
    figure = Figure(figsize=(width, height), dpi=dpi)
    axes = figure.add_axes(
        (
            _MARGIN_W / width,
            (0.6 + 0.25 * len(notes(g))) / height,
            _CELL_W * len(g.columns) / width,
            _CELL_H * len(g.rows) / height,
        )
    )
    colours = matplotlib.colormaps["tab10"]
    for (r, c), devices in g.cells.items():
        owners = sorted({g.process_of[d] for d in devices})
        top = len(g.rows) - 1 - r
        # A block held by several processes is hatched: its replicas cross processes.
        axes.add_patch(
            Rectangle(
                (c, top),
                1,
                1,
                facecolor=colours(owners[0] % 10),
                alpha=0.45,
                edgecolor="black",
                linewidth=1.2,
                hatch="//" if len(owners) > 1 else None,
            )
        )
        axes.text(c + 0.5, top + 0.5, label(g, devices), ha="center", va="center", fontsize=9)
    axes.set_xlim(0, len(g.columns))
    axes.set_ylim(0, len(g.rows))
    axes.set_xticks([c + 0.5 for c in range(len(g.columns))])
    axes.set_xticklabels(
        ["  ".join(f"[{a}:{b}]" for a, b in key) or "all" for key in g.columns], fontsize=8
    )
    axes.xaxis.tick_top()
    axes.set_yticks([len(g.rows) - 1 - r + 0.5 for r in range(len(g.rows))])
    axes.set_yticklabels(
        ["  ".join(f"[{a}:{b}]" for a, b in key) or "all" for key in g.rows], fontsize=8
    )
    axes.set_xlabel(" ".join(f"dim {d}" for d in g.across), fontsize=8)
    axes.xaxis.set_label_position("top")
    axes.set_ylabel(" ".join(f"dim {d}" for d in g.down), fontsize=8)
    figure.suptitle(title(g), fontsize=9, y=1 - 0.15 / height, va="top")
    lines = notes(g)
    for i, line in enumerate(lines):
        figure.text(0.02, (0.1 + 0.25 * (len(lines) - 1 - i)) / height, line, fontsize=8)
    figure.savefig(path, dpi=dpi)
    return path
