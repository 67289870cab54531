"""The benchmark figures the README and the benchmarks page show are those in
``benchmarks/results/``: a row that names a figure no run measured fails here, so the
headline table cannot go stale when a benchmark is run again.

Every row of each page's headline table is checked: ``CHECKED`` holds, per page, a
checker for each row, found by the start of its first cell, and a row without one fails.
A checker computes the row's figures from the results files, formatted as the table
writes them, and each must appear in the row.
"""

from __future__ import annotations

import json
import signal
import statistics
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
README, GUIDE = ROOT / "README.md", ROOT / "docs" / "guides" / "benchmarks.md"
HEADINGS = {README: "## Benchmarks", GUIDE: "## Headline figures"}  # each page's table
PAGES = list(HEADINGS)
TIMES, DASH = "\u00d7", "\u2013"  # the tables' multiplication sign and en dash


def _lines(file: str, /, **where: Any) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (RESULTS / file).read_text().splitlines() if line]
    return [r for r in rows if all(r.get(k) == v for k, v in where.items())]


def _one(file: str, key: str, /, **where: Any) -> float:
    found = _lines(file, **where)
    assert len(found) == 1, f"{file}: {len(found)} lines match {where}"
    return found[0][key]


def _range(values: Iterable[float], unit: str = TIMES) -> str:
    values = list(values)
    return f"{min(values):.2f}{DASH}{max(values):.2f}{unit}"


def _arrays() -> list[str]:
    file, ours = "loader_throughput_1x8.jsonl", "meshfeed:per_process"  # the default strategy
    rate = {r["name"]: r["samples_per_s"] for r in _lines(file, workload="A")}
    return [
        f"{_one(file, 'ratio_to_floor', workload='A', name=ours):.2f}{TIMES}",
        f"{rate[ours] / rate['torch_dataloader']:.1f}{TIMES} the PyTorch DataLoader",
        f"{rate[ours] / rate['grain']:.0f}{TIMES} Grain's `MapDataset`",
    ]


def _decode() -> list[str]:
    row = {"label": "issue44", "name": "meshfeed:2"}
    return [
        f"{_one('pipeline_limit.jsonl', 'ratio_to_limit', **row):.3f}{TIMES}",
        f"{_one('pipeline_limit.jsonl', 'ratio_to_torch', **row):.2f}{TIMES}",
    ]


def _wait(*, read_ahead: bool = False) -> list[str]:
    def share(prefetch: int | str) -> float:
        found = _one("input_wait.jsonl", "input_wait_share", prefetch=prefetch, latency_ms=20.0)
        return 100 * found

    figures = [f"{share('auto'):.1f}%", f"{share(0):.0f}% reading in the loop"]
    if read_ahead:
        figures.append(f"{share(2):.0f}% with 2 steps read ahead")
    return figures


def _slow_source() -> list[str]:
    def worst(latency: float, *, fixed: bool = False) -> str:
        (row,) = _lines("slow_source.jsonl", name=f"summary:{latency:g}ms")
        waits = row["fixed"]["input_wait_share"] if fixed else row["input_wait_share"]["auto"]
        return f"{100 * max(waits):.1f}%"

    return [
        worst(2.0),
        f"`prefetch=2` {worst(2.0, fixed=True)}",
        f"behind 20 ms {worst(20.0)}",
        f"`prefetch=16`: {worst(20.0, fixed=True)}",
    ]


def _prepare() -> list[str]:
    def ratio(to: str) -> float:
        return _one("prepare.jsonl", f"ratio_to_{to}", name="meshfeed")

    return [
        f"{ratio('limit'):.2f}{TIMES}",
        f"{ratio('datasets'):.2f}{TIMES} `datasets.map`",
        f"{ratio('datatrove'):.2f}{TIMES} datatrove",
    ]


def _chat() -> list[str]:
    def ratio(template: str, to: str, key: str = "meshfeed_over_this") -> str:
        got = _one("chat.jsonl", key, conversations=20_000, template=template, entry=to)
        return f"{got:.2f}{TIMES}"

    return [
        f"| {ratio('qwen2_5_training', 'datasets')} |",
        f"{ratio('qwen2_5_training', 'datasets', 'meshfeed_over_map_alone')} its map alone",
        f"{ratio('qwen2_5', 'datasets')} on Qwen2.5's own template",
        f"{ratio('qwen2_5_training', 'loop')} a plain loop",
    ]


def _pack_plan() -> list[str]:
    line = _lines("pack_plan.jsonl", part="start-up", documents=16_000_000)
    assert len(line) == 1
    got = line[0]
    more = got["planned_rss_mb"] - got["unpacked_rss_mb"]
    requests = {_one("pack_plan.jsonl", "requests", part="s3-open", documents=n, smoke=False)
                for n in (100_000, 1_000_000)}  # fmt: skip
    assert len(requests) == 1
    return [f"| {got['kept_s']:.3f} s |", f"{got['planned_s']:.1f} s and +{more:.0f} MB",
            f"{requests.pop()} requests"]  # fmt: skip


def _train_memory() -> list[str]:
    def peak(way: str) -> float:
        return _one("train_memory.jsonl", "peak_mb", part="memory", way=way)

    replicated = peak("replicated")
    return [
        f"{peak('fsdp_donated') / replicated:.3f}{TIMES}",
        f"({peak('fsdp_donated'):.0f} MB against {replicated:,.0f})",
        f"donation alone {peak('replicated_donated') / replicated:.2f}{TIMES}",
    ]


def _microbatches() -> list[str]:
    def peak(m: int) -> float:
        return _one("train_memory.jsonl", "peak_mb", part="microbatches", microbatches=m)

    return [
        f"| {peak(4) / peak(1):.3f}{TIMES} |",
        f"({peak(4):.0f} MB against {peak(1):.0f})",
        f"`microbatches=2` {peak(2) / peak(1):.3f}{TIMES}",
    ]


def _saves() -> list[str]:
    slow, fast = (_lines("train_memory.jsonl", part="saves", parameters=n)[0]
                  for n in (2_099_200, 525_312))  # fmt: skip
    return [
        f"| {slow['local_over_none']:.3f}{TIMES} |",
        f"to the local S3 server {slow['s3_over_none']:.3f}{TIMES}",
        f"at 28 ms a step {fast['local_over_none']:.2f}{TIMES}",
    ]


def _vision() -> list[str]:
    def over(entry: str) -> float:
        return _one("vision.jsonl", "over_loops_x2", entry=entry, smoke=False)

    return [
        f"| {over('meshfeed:2'):.3f}{TIMES} |",
        f"{over('meshfeed:2') / over('torch:2'):.2f}{TIMES} the DataLoader",
        f"CPU codecs {over('meshfeed-nvimgcodec-cpu:2'):.2f}{TIMES}",
    ]


def _image_store() -> list[str]:
    def ratio(images: str, what: str) -> float:
        return _one("image_store.jsonl", "ratio", images=images, what=what)

    return [
        f"| {ratio('small', 'shards-2/folder-2'):.1f}{TIMES} |",
        f"{ratio('small', 'shards/folder'):.1f}{TIMES} at the default",
        f"ImageNet-size images {ratio('imagenet', 'shards-2/folder-2'):.2f}{TIMES}",
    ]


def _tar_loading() -> list[str]:
    ratio = _one("formats.jsonl", "ratio_to_webdataset", part="loading", name="meshfeed")
    return [f"{ratio:.2f}{TIMES}"]


def _indexing() -> list[str]:
    ratios = [
        _one("formats.jsonl", "ratio_to_read", part="indexing", name=n, executor="local")
        for n in ("tar", "tar-16")
    ]
    big = _one("formats.jsonl", "ratio_to_read", part="indexing", name="tar-64")
    return [_range(ratios), f"{big:.2f}{TIMES} over 64 shards, ~1 GB"]


def _ray() -> list[str]:
    """C: the median of every round of the runs after issue 75's change (and before it),
    pooled: single rounds swing more than the runs' medians differ."""

    def pooled(build: str) -> float:
        rows = _lines("ray_workers_chunks.jsonl", workload="C", name="ray:2", build=build)
        assert len(rows) >= 4, f"ray_workers_chunks.jsonl: {len(rows)} runs of {build!r}"
        return statistics.median(r for row in rows for r in row["ratio_by_round"])

    speedup = _one("ray_workers.jsonl", "speedup", workload="S", name="ray:16")
    return [
        f"{pooled('after'):.2f}{TIMES}",
        f"{pooled('before (ff18ff9)'):.2f}{TIMES} before",
        f"16 sleeping Ray workers {speedup:.1f}{TIMES} one",
    ]


def _packing() -> list[str]:
    ratio = _one("packing.jsonl", "ratio_to_grain", name="throughput")
    bins = _one("packing.jsonl", "grain_bins", name="throughput")  # Grain as timed
    ours = 100 * _one("packing.jsonl", "meshfeed", name="padding")
    grain = 100 * _one("packing.jsonl", f"grain_{bins}_bins", name="padding")
    return [f"{ratio:.1f}{TIMES}", f"{ours:.2f}% padding against its {grain:.2f}%"]


def _schedules() -> list[str]:
    scheduled = ("staged_ratio", "ramp_ratio", "staged_ramp_ratio")  # each against fixed
    ratios = [r[k] for r in _lines("schedules.jsonl") for k in scheduled if k in r]
    assert len(ratios) == 5, f"schedules.jsonl: {len(ratios)} ratios, ids/s and rows/s"
    return [_range(ratios)]


def _requests() -> list[str]:
    def requests(shuffle: str) -> float:
        return _one("remote.jsonl", "requests_per_epoch", part="reads", name=f"s3:{shuffle}")

    return [f"{requests('per-example') / requests('block'):.1f}{TIMES} fewer"]


def _lost() -> list[str]:
    killed = _lines("lost_process.jsonl", part="kill")
    ours = [r["seconds_to_exit"] for r in killed if r.get("who") == "meshfeed"]
    jax = [r for r in killed if r.get("who") == "jax"]
    codes = sorted({r["exit_code"] for r in jax})
    end = "a C++ abort" if codes == [-signal.SIGABRT] else f"exit codes {codes}"
    plain = statistics.median(r["seconds_to_exit"] for r in jax)
    return [_range(ours, unit=" s"), f"{plain:.0f} s and {end}"]


def _writers(*, clu: bool = False) -> list[str]:
    figures = [f"{_one('writers.jsonl', 'ratio_to_none', name='tensorboardX'):.3f}{TIMES}"]
    if clu:
        ratio = _one("writers.jsonl", "ratio_to_none", name="clu-like")
        figures.append(f"{ratio:.3f}{TIMES} with a CLU-style writer")
    return figures


def _stats() -> list[str]:
    def share(case: str) -> float:
        return 100 * _one("stats.jsonl", "share", case=case)

    ratio = _one("stats.jsonl", "ratio", case="plain, prefetch=2")
    return [
        f"{share('plain'):.2f}%",
        f"{ratio:.3f}{TIMES} its steps/s against the build before the counters",
        f"{share('record'):.2f}% with a record transform",
    ]


def _ceiling() -> list[str]:
    def ratio(file: str, workers: int) -> str:
        found = _one(file, "cpu_per_memcpy", workload="ceiling", name=str(workers))
        return f"{found:.2f}{TIMES}"

    now, before = "gpu_host.jsonl", "gpu_host_before.jsonl"
    return [
        ratio(now, 1),
        f"({ratio(before, 1)} before)",
        f"{ratio(now, 2)} with 2 workers ({ratio(before, 2)} before)",
    ]


def _select() -> list[str]:
    def ratio(n: int, predicate: str, name: str = "select:2") -> str:
        figure = _one("filters.jsonl", "ratio_to_loop", examples=n, predicate=predicate,
                      name=name)  # fmt: skip
        return f"{figure:.2f}{TIMES}"

    return [
        f"| {ratio(200_000, 'text')} |",
        f"; {ratio(200_000, 'text', 'select:2 cold')} with none",
        f"2,000,000 examples: {ratio(2_000_000, 'text')}",
        f"a 1 µs predicate {ratio(2_000_000, 'embedding')}",
    ]


def _selection() -> list[str]:
    ratio = _one("filters.jsonl", "ratio_to_copied", workload="loader", name="selection")
    size = _one("filters.jsonl", "bytes_per_example", workload="bytes")
    return [f"{ratio:.2f}{TIMES}", f"{size:.1f} bytes an example"]


def _read_ahead() -> list[str]:
    after = {
        r["source"]: r["ratio_to_best_fixed"]
        for r in _lines("read_ahead.jsonl", label="after")
        if "ratio_to_best_fixed" in r and r.get("name", "").startswith("summary:")
    }
    assert sorted(after) == ["folder", "memory", "mmap"], after
    deep = [
        r["depth"]
        for r in _lines("read_ahead.jsonl", label="after")
        if "process" in r and r["depth"] > 2
    ]
    before = [r for r in _lines("read_ahead.jsonl", label="before") if "process" in r]
    slow = [r for r in before if r["depth"] > 2]
    return [
        f"{min(a['min'] for a in after.values()):.2f}{TIMES}",
        f"median {_range(a['median'] for a in after.values())}",
        "none deeper than 2" if not deep else f"{len(deep)} deeper than 2",
        f"{len(slow)} process of {len(before)}",
        f"{min(r['ratio_to_floor'] for r in slow):.2f}{TIMES}",
    ]


def _startup() -> list[str]:
    after = {
        r["source"]: r["total"]
        for r in _lines("startup.jsonl", part="startup", files=10_000, build="after")
    }
    assert sorted(after) == ["folder", "parquet", "tar"] and set(after.values()) == {1}
    folder = _one("startup.jsonl", "total", part="startup", source="folder", files=2048,
                  build="before")  # fmt: skip
    tar = _one("startup.jsonl", "requests_per_file", part="startup", source="tar", files=2048,
               build="before")  # fmt: skip
    return ["1 request", f"{folder:,} requests", f"{tar:.1f} a tar shard"]


def _open_files() -> list[str]:
    def ratio(files: int, rows: int) -> str:
        found = _one("startup.jsonl", "ratio_to_unbounded", part="cache", files=files,
                     rows_a_shard=rows, name="bounded")  # fmt: skip
        return f"{found:.2f}{TIMES}"

    return [ratio(128, 32), ratio(4096, 2), ratio(4096, 32)]


def _tail() -> list[str]:
    def held(key: str, hedge: bool) -> float:
        return _one("hedge.jsonl", key, share=0.03, hold=2.0, hedge=hedge, smoke=False)

    return [
        f"{held('against_clean', True):.2f}{TIMES}",
        f"{held('against_clean', False):.2f}{TIMES} without hedging",
        f"duplicates {100 * held('duplicate_share', True):.1f}%",
    ]


def _attention() -> list[str]:
    def peak(path: str, tokens: int) -> float:
        return _one("attention.jsonl", "peak_mb", part="memory", path=path, tokens=tokens,
                    passes="forward_backward", smoke=False)  # fmt: skip

    time = _one("attention.jsonl", "packed_over_dense", part="time", row="packed_row",
                tokens=8192, passes="forward_backward", smoke=False)  # fmt: skip
    growth = _one("attention.jsonl", "peak_over_qkv_per_doubling", part="memory_growth",
                  path="packed", passes="forward_backward", smoke=False)  # fmt: skip
    assert growth <= 1.1, f"packed attention's peak grows {growth} per doubling over q, k, v"
    return [
        f"{peak('packed', 32768):.0f} MB",
        f"{peak('dense', 32768) / 1000:.1f} GB",
        f"{time:.2f}{TIMES} its time at 8k tokens",
    ]


def _context_layout() -> list[str]:
    def share(cp: int) -> str:
        return _range(r["device_over_row"] for r in _lines("context_layout.jsonl", part="bytes",
                                                            cp=cp, smoke=False))  # fmt: skip

    host = _lines("context_layout.jsonl", part="host", smoke=False)
    return [f"{share(4)}, {share(8)}", _range(r["laid_out_over_packed"] for r in host)]


def _balance() -> list[str]:
    rules = _lines("balance.jsonl", name="rule", devices=64, rows_per_device=1, smoke=False)

    def of(*names: str) -> list[dict[str, Any]]:
        return [r for r in rules if r["rule"] in names]

    peers = ("tunix", "trl", "torchtitan", "slime")
    ours = of("meshfeed_balanced")
    assert ours and all(r["cap_violations"] == 0 for r in ours)
    caps = [100 * r["cap_violation_fraction"] for r in of("trl", "slime")]
    return [
        f"{min(r['imbalance'] for r in ours):.3f}{DASH}{max(r['imbalance'] for r in ours):.3f}",
        f"{min(r['imbalance'] for r in of('meshfeed_random')):.2f}{DASH}"
        f"{max(r['imbalance'] for r in of('meshfeed_random')):.1f} for steps as they come",
        f"{min(r['imbalance'] for r in of(*peers)):.2f}{DASH}"
        f"{max(r['imbalance'] for r in of(*peers)):.1f} for tunix's",
        f"in {min(caps):.0f}{DASH}{max(caps):.0f}% of device-steps",
        f"{max(r['plan_ms_per_step'] for r in ours):.2f} ms a step",
    ]


def _fill() -> list[str]:
    def fill(histogram: str, algorithm: str, **where: Any) -> list[float]:
        found = _lines("packing_fill.jsonl", name="fill", histogram=histogram,
                       algorithm=algorithm, smoke=False, **where)  # fmt: skip
        return [100 * r["real_token_fraction"] for r in found]

    ours = fill("wikipedia", "best_fit_decreasing", max_segments=None)
    squad = fill("squad", "lpfhp")[0]
    assert max(fill("squad", "best_fit_decreasing", max_segments=None)) >= squad
    return [
        f"{min(ours):.2f}{DASH}{max(ours):.2f}%",
        f"LPFHP {fill('wikipedia', 'lpfhp')[0]:.2f}%",
        f"SPFHP {fill('wikipedia', 'spfhp')[0]:.2f}%",
        f"`best_fit` {fill('wikipedia', 'best_fit', max_segments=None)[0]:.2f}%",
        f"LPFHP's {squad:.2f}%",
    ]


Checks = dict[str, Callable[[], list[str]]]

BOTH: Checks = {  # rows both pages show, by a start of the first cell common to both
    "arrays into global `jax.Array`s": _arrays,
    "PNG decode + crop in 2 workers": _decode,
    "the loading process's CPU a step, 224² rows from a copying worker": _ceiling,
    "`meshfeed.select` on 2 workers, a 20 µs predicate": _select,
    "a loader over a selection": _selection,
    "input wait behind 20 ms per read": _wait,
    "input wait behind 2 ms per read, 5 fresh processes": _slow_source,
    "text to tokens, `meshfeed.prepare` with 2 workers": _prepare,
    "conversations to HF's chat-template tokens and masks": _chat,
    "WebDataset shards read by index": _tar_loading,
    "WebDataset shards indexed": _indexing,
    "PNG decode + crop on 2 Ray workers": _ray,
    "packed tokens/s into global arrays": _packing,
    "a packed corpus to its first batch, 16M documents": _pack_plan,
    "weights by stage and a batch size that ramps": _schedules,
    "a killed process ends the job": _lost,
    "`fit` writing to a tensorboardX `SummaryWriter`": _writers,
    "counting behind `loader.stats()`": _stats,
    "the default read-ahead, 20 fresh processes a source": _read_ahead,
    "a host opening data on S3, 10,000 files": _startup,
    "reads through at most 128 open files": _open_files,
    "a store's slow tail, 3% of range reads held 2 s": _tail,
}
CHECKED: dict[Path, Checks] = {
    README: BOTH,
    GUIDE: {  # the benchmarks page: a row and figures more
        **BOTH,
        "input wait behind 20 ms per read": partial(_wait, read_ahead=True),
        "requests per epoch from object storage, `shuffle_block`": _requests,
        "images from object storage at 30 ms a request": _image_store,
        "`fit` writing to a tensorboardX `SummaryWriter`": partial(_writers, clu=True),
        "a train step's peak memory a device, 100M parameters": _train_memory,
        "a train step's peak memory a device, activations first": _microbatches,
        "ImageNet-size JPEGs to augmented batches": _vision,
        "`fit` with an asynchronous checkpoint every 10 steps": _saves,
        "attention on a packed row of 32k tokens": _attention,
        "one device's reads of a row under a context layout": _context_layout,
        "the slowest of 64 data-parallel devices over the mean": _balance,
        'real-token fraction, `algorithm="best_fit_decreasing"`': _fill,
    },
}


def _table(page: Path) -> list[str]:
    """The body rows of the first table under the page's heading."""
    parts = page.read_text().split(f"\n{HEADINGS[page]}\n", 1)
    assert len(parts) == 2, f"{page.name}: no {HEADINGS[page]!r} section"
    lines = parts[1].split("\n## ", 1)[0].splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("| what |")), None)
    assert start is not None, f"{page.name}: no table under {HEADINGS[page]!r}"
    table = []
    for line in lines[start + 2 :]:  # past the header and its rule
        if not line.startswith("|"):
            break
        table.append(line)
    assert table, f"{page.name}: the headline table has no rows"
    return table


def _row(page: Path, start: str) -> str:
    rows = [line for line in _table(page) if line.startswith(f"| {start}")]
    assert len(rows) == 1, f"{page.name}: {len(rows)} rows start with {start!r}"
    return rows[0]


CASES = [(page, start) for page, checks in CHECKED.items() for start in checks]


@pytest.mark.parametrize(("page", "start"), CASES, ids=[f"{p.name}:{s}" for p, s in CASES])
def test_a_headline_figure_is_the_one_measured(page, start):
    row = _row(page, start)
    for figure in CHECKED[page][start]():
        assert figure in row, f"{page.name}: {row!r} should show {figure} (benchmarks/results)"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_headline_row_has_a_checker(page):
    starts = [f"| {start}" for start in CHECKED[page]]
    unchecked = [row for row in _table(page) if not any(map(row.startswith, starts))]
    assert not unchecked, f"{page.name}: rows with no checker in CHECKED: {unchecked}"
