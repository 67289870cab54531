"""The benchmark figures the README and the benchmarks page show are those in
``benchmarks/results/``: a row that names a figure no run measured fails here, so the
headline table cannot go stale when a benchmark is run again.

Each checked row is found by the start of its first cell; its figures are computed from
the results files, formatted as the table writes them, and must appear in the row.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PAGES = [ROOT / "README.md", ROOT / "docs" / "guides" / "benchmarks.md"]
TIMES, DASH = "\u00d7", "\u2013"  # the tables' multiplication sign and en dash


def _lines(file: str, /, **where: Any) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (RESULTS / file).read_text().splitlines() if line]
    return [r for r in rows if all(r.get(k) == v for k, v in where.items())]


def _one(file: str, key: str, /, **where: Any) -> float:
    found = _lines(file, **where)
    assert len(found) == 1, f"{file}: {len(found)} lines match {where}"
    return found[0][key]


def _decode() -> list[str]:
    row = {"label": "after", "name": "meshfeed:2"}
    return [
        f"{_one('pipeline_limit.jsonl', 'ratio_to_limit', **row):.3f}{TIMES}",
        f"{_one('pipeline_limit.jsonl', 'ratio_to_torch', **row):.2f}{TIMES}",
    ]


def _ray() -> list[str]:
    ratio = _one("ray_workers.jsonl", "ratio_to_processes", workload="C", name="ray:2")
    speedup = _one("ray_workers.jsonl", "speedup", workload="S", name="ray:16")
    return [f"{ratio:.2f}{TIMES}", f"16 sleeping Ray workers {speedup:.1f}{TIMES} one"]


def _indexing() -> list[str]:
    ratios = [
        _one("formats.jsonl", "ratio_to_read", part="indexing", name=n, executor="local")
        for n in ("tar", "tar-16")
    ]
    return [f"{min(ratios):.2f}{DASH}{max(ratios):.2f}{TIMES}"]


CHECKED: dict[str, Callable[[], list[str]]] = {
    "PNG decode + crop in 2 workers": _decode,
    "PNG decode + crop on 2 Ray workers": _ray,
    "WebDataset shards indexed": _indexing,
}


def _row(page: Path, start: str) -> str:
    rows = [line for line in page.read_text().splitlines() if line.startswith(f"| {start}")]
    assert len(rows) == 1, f"{page.name}: {len(rows)} rows start with {start!r}"
    return rows[0]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
@pytest.mark.parametrize("start", sorted(CHECKED))
def test_a_headline_figure_is_the_one_measured(page, start):
    row = _row(page, start)
    for figure in CHECKED[start]():
        assert figure in row, f"{page.name}: {row!r} should show {figure} (benchmarks/results)"
