"""Layouts as text: which device (and process) holds which block of an array.

``jax.debug.visualize_array_sharding`` draws 1-D and 2-D arrays of one process. Here
any rank works: the layout is a grid over the dimensions that are split -- the first
split dimension down, the others across (a 1-D array across, a 2-D array as it is) --
and the dimensions that are not split, and the mesh axes that replicate the array, are
named beneath it. Everything comes from ``sharding.devices_indices_map(shape)``, which
every process computes for every device, so the text is the same on every process and
needs no data.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import math
from collections.abc import Sequence
from typing import Any

import jax
from jax.sharding import NamedSharding, Sharding
from rich import box
from rich.console import Console
from rich.table import Table

from meshfeed.core._mesh import Device, process_map, spec_axes

Range = tuple[int, int]


@dataclasses.dataclass(frozen=True)
class Grid:
    """The blocks of an array, arranged for drawing, and the devices that hold each."""

    shape: tuple[int, ...]
    dtype: Any
    sharding: Sharding
    down: tuple[int, ...]  # the dimension indexing rows (at most one)
    across: tuple[int, ...]  # the dimensions indexing columns
    rows: list[tuple[Range, ...]]
    columns: list[tuple[Range, ...]]
    cells: dict[tuple[int, int], list[Device]]
    process_of: dict[Device, int]

    @property
    def processes(self) -> list[int]:
        return sorted(set(self.process_of.values()))

    @property
    def split(self) -> tuple[int, ...]:
        return tuple(d for d in self.down + self.across if self._count(d) > 1)

    def _count(self, dim: int) -> int:
        axis = self.down if dim in self.down else self.across
        position = axis.index(dim)
        keys = self.rows if axis is self.down else self.columns
        return len({key[position] for key in keys})


def _target(x: Any, shape: Sequence[int] | None) -> tuple[Sharding, tuple[int, ...], Any]:
    if isinstance(x, jax.Array):
        return x.sharding, tuple(x.shape), x.dtype
    if isinstance(x, Sharding):
        if shape is None:
            raise ValueError("pass shape= with a Sharding: a layout needs the array's shape.")
        return x, tuple(int(d) for d in shape), None
    raise TypeError(f"expected a jax.Array or a Sharding, got {type(x).__name__}.")


def grid(x: Any, *, shape: Sequence[int] | None = None, processes: int | None = None) -> Grid:
    """The layout of ``x`` (an array, or a sharding with ``shape``) as a grid of blocks."""
    sharding, full_shape, dtype = _target(x, shape)
    index_map = sharding.devices_indices_map(full_shape)
    ranges: dict[Device, tuple[Range, ...]] = {
        d: tuple(tuple(s.indices(n)[:2]) for s, n in zip(index, full_shape, strict=True))  # type: ignore[misc]
        for d, index in index_map.items()
    }
    distinct = [sorted({r[dim] for r in ranges.values()}) for dim in range(len(full_shape))]
    split = [dim for dim, values in enumerate(distinct) if len(values) > 1]
    if len(full_shape) == 1:
        down, across = (), (0,)
    elif len(full_shape) == 2:
        down, across = (0,), (1,)
    else:
        down, across = tuple(split[:1]), tuple(split[1:])
    rows = list(itertools.product(*(distinct[d] for d in down)))
    columns = list(itertools.product(*(distinct[d] for d in across)))
    cells: dict[tuple[int, int], list[Device]] = {}
    for device, r in ranges.items():
        key = (rows.index(tuple(r[d] for d in down)), columns.index(tuple(r[d] for d in across)))
        cells.setdefault(key, []).append(device)
    for held in cells.values():
        held.sort(key=lambda d: d.id)
    return Grid(
        shape=full_shape,
        dtype=dtype,
        sharding=sharding,
        down=down,
        across=across,
        rows=rows,
        columns=columns,
        cells=cells,
        process_of=process_map(list(index_map), processes),
    )


def title(g: Grid) -> str:
    """The array (or shape), its spec and its mesh, in one line."""
    what = f"{g.dtype}{list(g.shape)}" if g.dtype is not None else f"shape {list(g.shape)}"
    if isinstance(g.sharding, NamedSharding):
        mesh = " x ".join(f"{k}={v}" for k, v in g.sharding.mesh.shape.items())
        return f"{what}  {g.sharding.spec} on mesh {mesh}"
    return f"{what}  {type(g.sharding).__name__}"


def notes(g: Grid) -> list[str]:
    """What the grid does not show: whole dimensions, replicating mesh axes, processes."""
    out = []
    whole = [d for d in range(len(g.shape)) if d not in g.split]
    if whole:
        out.append("not split: " + ", ".join(f"dim {d} ({g.shape[d]})" for d in whole))
    if isinstance(g.sharding, NamedSharding):
        used = {a for entry in g.sharding.spec for a in spec_axes(entry)}
        free = [a for a in g.sharding.mesh.axis_names if a not in used]
        if free:
            copies = math.prod(g.sharding.mesh.shape[a] for a in free)
            out.append(f"replicated over mesh axes {tuple(free)}: {copies} copies of each block")
    if len(g.processes) > 1:
        out.append(f"{len(g.processes)} processes: d = device ids, p = process ids")
    return out


def label(g: Grid, devices: list[Device]) -> str:
    ids = "d" + ",".join(str(d.id) for d in devices)
    if len(g.processes) < 2:
        return ids
    return ids + "\np" + ",".join(str(p) for p in sorted({g.process_of[d] for d in devices}))


def _range_label(dims: tuple[int, ...], key: tuple[Range, ...]) -> str:
    return "  ".join(f"[{a}:{b}]" for a, b in key) if dims else ""


def show_sharding(
    x: Any,
    *,
    shape: Sequence[int] | None = None,
    processes: int | None = None,
    quiet: bool = False,
) -> str:
    """Prints the layout of ``x`` as text, one box per block labelled with the devices
    holding it (like ``jax.debug.visualize_array_sharding``), and returns the text.

    Args:
      x: a ``jax.Array``, or a ``Sharding`` together with ``shape``.
      shape: the global shape, when ``x`` is a sharding.
      processes: label processes as if the devices were split, in order, over this many
        processes (default: the real ones). With several processes each box shows the
        device ids (``d``) and the process ids (``p``) holding it.
      quiet: return the text without printing it.

    Returns:
      The same text on every process; it reads no data. Rows are the blocks of the
      first split dimension (dimension 0 of a 2-D array), columns those of the others.

    Example:
      >>> meshfeed.show_sharding(batch["image"])  # doctest: +SKIP
    """
    g = grid(x, shape=shape, processes=processes)
    table = Table(box=box.SQUARE, show_lines=True, show_header=True)
    across = ("dims " if len(g.across) > 1 else "dim ") + ", ".join(map(str, g.across))
    heading = " ".join(f"dim {d}" for d in g.down)
    table.add_column(
        heading + (" \\ " if g.down else "") + (across if g.across else ""), no_wrap=True
    )
    for column in g.columns:
        table.add_column(_range_label(g.across, column) or "all", justify="center", no_wrap=True)
    for r, row in enumerate(g.rows):
        cells = [label(g, g.cells.get((r, c), [])) for c in range(len(g.columns))]
        table.add_row(_range_label(g.down, row) or "all", *cells)
    out = io.StringIO()
    width = max(80, 18 * (len(g.columns) + 1))
    Console(file=out, width=width, color_system=None, highlight=False).print(table)
    text = "\n".join([title(g), out.getvalue().rstrip(), *notes(g)]) + "\n"
    if not quiet:
        print(text, end="")
    return text
