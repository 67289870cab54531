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

PANELS = [  # results file, its lines of this workload (None: all), title, figure
    ("loader_throughput_1x8", "A", "A: arrays, 1 process x 8 devices", "samples_per_s"),
    ("loader_throughput_1x8", "B", "B: arrays, 1 process x 8 devices", "samples_per_s"),
    ("loader_throughput_2x4", "A", "A: arrays, 2 processes x 4 devices", "samples_per_s"),
    ("loader_throughput_2x4", "B", "B: arrays, 2 processes x 4 devices", "samples_per_s"),
    ("decode_throughput", None, "C: PNG decode + crop, by workers", "samples_per_s"),
    ("source_throughput", None, "P, R: Parquet and ArrayRecord files", "samples_per_s"),
    ("memory", None, "D: 4 GiB memmap, peak RSS (GiB)", "peak_rss_gib"),
    ("input_wait", None, "E: fit, share of time waiting for input", "input_wait_share"),
]


def _bars(ax: Any, rows: list[dict[str, Any]], title: str, key: str) -> None:
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
    data = {
        path.stem: [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for path in sorted(folder.glob("*.jsonl"))
    }
    panels = []
    for stem, workload, title, key in PANELS:
        rows = [r for r in data.get(stem, []) if workload in (None, r.get("workload"))]
        if rows:
            panels.append((rows, title, key))
    columns = 2
    rows_count = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows_count, columns, figsize=(12, 3.2 * rows_count), squeeze=False)
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
