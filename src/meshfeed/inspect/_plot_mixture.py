"""A mixture over the steps as a picture (matplotlib, an optional extra): each source's
share of the batches, measured from the steps' own ids, with the scheduled weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from meshfeed.data._mix import Mixture
from meshfeed.inspect._plot import picture_path, require_matplotlib

_ENDLESS_STEPS = 1000  # drawn of an endless loader over a mixture with fixed weights


def plot_mixture(loader: Any, path: str | Path, *, points: int = 400, dpi: int = 100) -> Path:
    """Draws each source's share of ``loader``'s batches over the steps to ``path``.

    The shares are measured: each drawn step's example ids, mapped to their sources by
    the mixture, as stacked areas; the scheduled weights are dashed lines over them, and
    a batch size that ramps is marked where it changes.

    Args:
      loader: a ``meshfeed.Loader`` that reads a ``meshfeed.mix`` directly.
      path: where to write the picture, ``.png`` or ``.svg``.
      points: steps drawn, spread evenly over the run (every step of a shorter run).
      dpi: the picture's resolution.
    """
    path = picture_path(path)
    mixture = getattr(loader, "source", None)
    if not isinstance(mixture, Mixture):
        raise TypeError(
            "plot_mixture takes a Loader that reads a mixture (meshfeed.mix) directly; "
            f"this one reads {type(mixture).__name__}."
        )
    if not isinstance(points, int) or points < 2:
        raise ValueError(f"points={points!r} must be an int >= 2.")
    _, Figure, _ = require_matplotlib("plot_mixture")
    try:
        end = len(loader)
    except TypeError:  # endless
        end = _ENDLESS_STEPS
    steps = np.unique(np.linspace(0, end - 1, min(points, end)).astype(np.int64))
    n = len(mixture.sources)
    measured = np.zeros((len(steps), n))
    scheduled = np.zeros((len(steps), n))
    for i, k in enumerate(steps.tolist()):
        ids = loader.ids(k)
        which = mixture.locate(ids[ids >= 0])[0]
        measured[i] = np.bincount(which, minlength=n) / max(1, len(which))
        scheduled[i] = mixture.weights_at(k) if mixture.ordered else mixture.weights
    figure = Figure(figsize=(10, 4.5), dpi=dpi)
    axes = figure.add_axes((0.08, 0.13, 0.74, 0.72))
    axes.stackplot(steps, measured.T, labels=[f"sources[{s}]" for s in range(n)], alpha=0.8)
    for line in np.cumsum(scheduled, axis=1).T[:-1]:
        axes.plot(steps, line, "--", color="black", linewidth=1)
    sizes = [loader.batch_size(int(k)) for k in steps]
    for i in range(1, len(steps)):
        if sizes[i] != sizes[i - 1]:
            axes.axvline(steps[i], color="grey", linestyle=":", linewidth=1)
            axes.text(steps[i], 1.01, f"batch {sizes[i]}", fontsize=7, ha="center")
    axes.set_xlim(0, max(1, end - 1))
    axes.set_ylim(0, 1)
    axes.set_xlabel("step", fontsize=8)
    axes.set_ylabel("share of the batch", fontsize=8)
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    figure.suptitle(
        f"each source's share of the batches over {end:,} steps: measured from the steps' "
        "ids (areas), scheduled weights dashed",
        fontsize=9,
    )
    figure.savefig(path, dpi=dpi)
    return path
