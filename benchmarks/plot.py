"""Draws benchmarks/results/*.jsonl into one PNG (matplotlib).

python3 benchmarks/plot.py benchmarks/results benchmarks/results.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

PANELS = [  # results file, title, figure
    ("decode_throughput", "C: PNG decode + crop, by workers", "samples_per_s"),
    ("source_throughput", "P, R: Parquet and ArrayRecord files", "samples_per_s"),
    ("memory", "D: 4 GiB memmap, peak RSS (GiB)", "peak_rss_gib"),
    ("input_wait", "E: fit, share of time waiting for input", "input_wait_share"),
]


def load(folder: Path) -> dict[str, list[dict[str, Any]]]:
    return {
        path.stem: [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for path in sorted(folder.glob("*.jsonl"))
    }


def _bars(ax: Any, rows: list[dict[str, Any]], title: str, key: str = "samples_per_s") -> None:
    rows = [r for r in rows if key in r]
    colours = {"meshfeed": "tab:blue", "floor": "tab:gray", "peer": "tab:orange"}
    ax.barh(
        [r["name"] for r in rows],
        [r[key] for r in rows],
        color=[colours.get(r.get("kind", "meshfeed"), "tab:blue") for r in rows],
    )
    ax.invert_yaxis()
    ax.set_title(title, fontsize=9)
    ax.tick_params(labelsize=7)
    ax.set_xlabel(key.replace("_", " "), fontsize=8)


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results")
    out = Path(sys.argv[2] if len(sys.argv) > 2 else "benchmarks/results.png")
    data = load(folder)
    panels = []
    for stem, label in (
        ("loader_throughput_1x8", "1 process x 8"),
        ("loader_throughput_2x4", "2 processes x 4"),
    ):
        for workload in ("A", "B"):
            rows = [r for r in data.get(stem, []) if r.get("workload") == workload]
            if rows:
                panels.append((rows, f"{workload}: arrays, {label} devices", "samples_per_s"))
    for stem, title, key in PANELS:
        if stem in data:
            panels.append((data[stem], title, key))
    columns = 2
    rows_count = -(-len(panels) // columns)
    size = (12, 3.2 * rows_count)
    figure, axes = plt.subplots(rows_count, columns, figsize=size, squeeze=False)
    for ax, (rows, title, key) in zip(axes.flat, panels, strict=False):
        _bars(ax, rows, title, key)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    figure.suptitle("meshfeed benchmarks (blue: meshfeed, grey: floor, orange: peers)", fontsize=10)
    figure.tight_layout()
    figure.savefig(out, dpi=90)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
