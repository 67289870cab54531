"""Where a step's time goes, as a picture: ``plot_pipeline(loader.stats(), path)``.

The top bar is the training loop's thread, one step long: the time ``next()`` waited for
rows (the read-ahead's or the record workers'), the time it placed them on the devices,
and the rest of the step (the computation it dispatched, logging, the loop itself).
Below it, one bar per stage that runs beside the loop -- reading the source, the record
transform, the batch transform -- with its work per step summed over the threads or
workers that did it, and for record workers, inside it, that work shared among them. A
stage whose share reaches the step's length (the dashed line) is what the loop waits
on.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from meshfeed.inspect._plot import picture_path, require_matplotlib

_LOOP = (("wait", "#d62728"), ("place", "#ff7f0e"), ("rest of the step", "#c7c7c7"))
_STAGE = "#1f77b4"
_SHARE = "#17becf"  # a stage's work per step over its workers


def _ms(seconds: float, steps: int) -> float:
    return 1000.0 * seconds / steps


def _stages(stats: Mapping[str, Any], steps: int) -> list[tuple[str, float, int, str]]:
    """``(label, ms per step, workers sharing it (0: unknown), note)`` of each stage
    beside the loop that ran."""
    seconds = max(float(stats["seconds"]), 1e-9)
    source = stats["source"]
    rate, mb = source["records"] / seconds, source["bytes"] / seconds / 1e6
    note = f"{rate:,.0f} records/s, {mb:,.1f} MB/s"
    url = source.get("url") or {}
    if url.get("requests"):
        note += f"; {url['requests']:,} requests ({url['retries']:,} retried)"
    if url.get("cache_hits") or url.get("cache_downloads"):
        note += f", cache {url['cache_hits']:,} hits / {url['cache_downloads']:,} downloads"
    if source.get("skipped"):
        note += f"; {source['skipped']:,} skipped"
    out = [("read the source", _ms(source["seconds"], steps), 0, note)]
    records = stats.get("record_transform")
    if records:
        workers = records["workers"]
        ms = _ms(records["seconds"], steps)
        where = "in the loading threads"
        if workers:
            where = f"{ms / workers:.2f} ms a step on {workers} {records['worker_type']}"
        note = f"{where}; {records['records'] / seconds:,.0f} records/s"
        if records.get("skipped"):
            note += f"; {records['skipped']:,} skipped"
        out.append(("record transform", ms, workers, note))
    transform = stats.get("transform")
    if transform:
        out.append(("batch transform", _ms(transform["seconds"], steps), 0, ""))
    return out


def _check(stats: object) -> int:
    if not isinstance(stats, Mapping) or "consumer" not in stats or "source" not in stats:
        raise TypeError(
            f"plot_pipeline takes a loader's stats() (a dict), got {type(stats).__name__}."
        )
    steps = int(stats["consumer"]["steps"])
    if steps < 1:
        raise ValueError(
            "these stats cover no step handed out yet: iterate the loader, then call "
            "loader.stats()."
        )
    return steps


def plot_pipeline(stats: Mapping[str, Any], path: str | Path, *, dpi: int = 100) -> Path:
    """Draws where a step's time went, stage by stage, to ``path`` (PNG or SVG).

    ``stats`` is what ``loader.stats()`` returned (or its JSON, read back), over a window
    that handed out at least one step; in a training loop the window should be the
    loop's, so the rest of the step is the loop's own work.
    """
    path = picture_path(path)
    steps = _check(stats)
    _, Figure, Rectangle = require_matplotlib("plot_pipeline")
    consumer = stats["consumer"]
    step_ms = _ms(float(stats["seconds"]), steps)
    wait = _ms(consumer["wait_seconds"], steps)
    place = _ms(stats["place"]["seconds"], steps)
    loop = [wait, place, max(0.0, step_ms - wait - place)]
    stages = _stages(stats, steps)
    rows = 1 + len(stages)
    figure = Figure(figsize=(10, 1.4 + 0.75 * rows), dpi=dpi)
    axes = figure.add_axes((0.2, 0.28, 0.77, 0.55))
    top = rows - 1
    at = 0.0
    patches = []
    for (label, colour), width in zip(_LOOP, loop, strict=True):
        patches.append(
            axes.add_patch(
                Rectangle(
                    (at, top + 0.15),
                    width,
                    0.7,
                    facecolor=colour,
                    edgecolor="k",
                    label=f"{label}: {width:.2f} ms",
                )
            )
        )
        at += width
    longest = max([step_ms, *(ms for _, ms, _, _ in stages)])
    for i, (_, ms, workers, note) in enumerate(stages):
        y = top - 1 - i
        axes.add_patch(Rectangle((0, y + 0.2), ms, 0.6, facecolor=_STAGE, edgecolor="k"))
        if workers > 1:  # what it takes of a step, shared by its workers
            share = ms / workers
            axes.add_patch(Rectangle((0, y + 0.35), share, 0.3, facecolor=_SHARE, edgecolor="k"))
            axes.text(share / 2, y + 0.5, f"÷ {workers}", ha="center", va="center", fontsize=7)
        axes.text(ms + longest / 100, y + 0.5, f"{ms:.2f} ms  {note}", va="center", fontsize=7)
    axes.axvline(step_ms, color="k", linestyle="--", linewidth=0.8)
    axes.text(step_ms, rows, " a step", va="bottom", fontsize=7)
    axes.legend(
        handles=patches, loc="upper right", fontsize=7, title="the loop, a step", title_fontsize=7
    )
    axes.set_xlim(0, 2.4 * longest)
    axes.set_ylim(0, rows)
    axes.set_yticks([top + 0.5 - r for r in range(rows)])
    axes.set_yticklabels(["the loop (one step)", *(s[0] for s in stages)], fontsize=8)
    axes.set_xlabel(
        "ms per step (stages beside the loop: summed over their threads/workers)", fontsize=8
    )
    ahead = consumer["read_ahead"]
    footer = f"read-ahead: depth {ahead['depth']}"
    if ahead.get("ready_share") is not None:
        footer += (
            f", the step read (or with the workers) at {100 * ahead['ready_share']:.0f}% of "
            f"asks, {ahead['steps_ready']:.1f} steps ready on average "
            f"({100 * ahead['fill']:.0f}% full)"
        )
    figure.text(0.2, 0.04, footer, fontsize=8)
    figure.suptitle(
        f"Where a step's time goes: {step_ms:.2f} ms a step over {steps:,} steps; the loop "
        f"waited for input {100 * wait / step_ms if step_ms else 0:.1f}% of it",
        fontsize=9,
    )
    figure.savefig(path, dpi=dpi)
    return path
