"""``meshfeed bench matmul``: every sharded matmul strategy against one device, timed.

Each strategy multiplies the same ``size x size`` float32 matrices on the mesh (compiled
first, then the median of ``repeats`` runs, each waited for), against the unsharded
``a @ b`` jitted on one device. Reported per strategy: milliseconds, TFLOP/s
(``2 size^3 / time``), the bytes its collectives move between devices, and the ratio of
its time to the one-device time; plus the layout of ``a``, ``b`` and the product, drawn
with ``show_sharding``.
"""

from __future__ import annotations

import functools
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from meshfeed import make_mesh, show_sharding
from meshfeed.ops import MATMUL_STRATEGIES, MatmulStrategy, bytes_moved, layouts, matmul


def _median_seconds(run: Any, repeats: int) -> float:
    jax.block_until_ready(run())  # compile and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(run())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_matmul(
    *,
    size: int = 4096,
    mesh: dict[str, int] | None = None,
    repeats: int = 5,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Times every strategy on ``mesh`` (default ``data=4, model=2``); ``progress`` is
    called with each entry as soon as it is timed.

    Returns:
      One dict per entry (``name``, ``ms``, ``tflops``, ``bytes_moved``,
      ``ratio_to_one_device``), and per strategy the text of its layouts.
    """
    axes = mesh or {"data": 4, "model": 2}
    the_mesh = make_mesh(**axes)  # type: ignore[arg-type]
    rng = np.random.default_rng(0)
    a = rng.normal(size=(size, size)).astype(np.float32)
    b = rng.normal(size=(size, size)).astype(np.float32)
    flops = 2 * size**3
    one = jax.devices()[0]
    a1, b1 = jax.device_put(a, one), jax.device_put(b, one)
    single = jax.jit(jnp.matmul)
    base = _median_seconds(lambda: single(a1, b1), repeats)
    rows = [
        {
            "name": "one device",
            "ms": round(base * 1e3, 3),
            "tflops": round(flops / base / 1e12, 4),
            "bytes_moved": 0,
            "ratio_to_one_device": 1.0,
        }
    ]
    if progress is not None:
        progress(rows[0])
    pictures = {}
    strategies: list[MatmulStrategy] = [s for s in MATMUL_STRATEGIES if len(axes) == 2 or s != "2d"]
    for strategy in strategies:
        spec_a, spec_b, _ = layouts(the_mesh, strategy)
        placed_a = jax.device_put(a, NamedSharding(the_mesh, spec_a))
        placed_b = jax.device_put(b, NamedSharding(the_mesh, spec_b))
        out = matmul(placed_a, placed_b, mesh=the_mesh, strategy=strategy)
        run = functools.partial(matmul, placed_a, placed_b, mesh=the_mesh, strategy=strategy)
        seconds = _median_seconds(run, repeats)
        moved = bytes_moved(the_mesh, strategy, size, size, size, 4)
        rows.append(
            {
                "name": strategy,
                "ms": round(seconds * 1e3, 3),
                "tflops": round(flops / seconds / 1e12, 4),
                "bytes_moved": moved if moved >= 0 else None,
                "ratio_to_one_device": round(seconds / base, 3),
            }
        )
        if progress is not None:
            progress(rows[-1])
        pictures[strategy] = "\n".join(
            [
                f"a: {spec_a}",
                show_sharding(placed_a, quiet=True),
                f"b: {spec_b}",
                show_sharding(placed_b, quiet=True),
                f"a @ b: {out.sharding.spec}",  # type: ignore[attr-defined]
                show_sharding(out, quiet=True),
            ]
        )
    return rows, pictures


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as an aligned text table."""
    head = f"{'strategy':<16}{'ms':>12}{'TFLOP/s':>10}{'bytes moved':>14}{'x one device':>14}"
    lines = [head, "-" * len(head)]
    for r in rows:
        moved = "XLA's choice" if r["bytes_moved"] is None else f"{r['bytes_moved']:,}"
        lines.append(
            f"{r['name']:<16}{r['ms']:>12.3f}{r['tflops']:>10.4f}{moved:>14}"
            f"{r['ratio_to_one_device']:>14.3f}"
        )
    return "\n".join(lines)


def report_matmul(
    *, size: int, mesh: dict[str, int] | None, repeats: int, layouts: bool = False
) -> int:
    """Runs ``bench_matmul``: says what it times first and each entry as it is done, then
    prints the table and one JSON line per entry (and each layout with ``layouts``)."""
    axes = mesh or {"data": 4, "model": 2}
    count = 1 + sum(1 for s in MATMUL_STRATEGIES if len(axes) == 2 or s != "2d")
    mesh_text = " x ".join(f"{k}={v}" for k, v in axes.items())
    print(
        f"timing a {size} x {size} float32 matmul on one device and {count - 1} sharded "
        f"strategies on {mesh_text} ({math.prod(axes.values())} devices), each compiled "
        f"then run {repeats + 1} times; on CPU devices this takes a while at size 4096.",
        file=sys.stderr,
        flush=True,
    )
    done = [0]

    def progress(row: dict[str, Any]) -> None:
        done[0] += 1
        print(
            f"  [{done[0]}/{count}] {row['name']}: {row['ms']:.1f} ms", file=sys.stderr, flush=True
        )

    rows, pictures = bench_matmul(size=size, mesh=mesh, repeats=repeats, progress=progress)
    if layouts:
        for strategy, picture in pictures.items():
            print(f"== {strategy}\n{picture}")
    print(table(rows))
    for line in rows:
        print(json.dumps({"benchmark": "matmul", "size": size, **line}))
    return 0
