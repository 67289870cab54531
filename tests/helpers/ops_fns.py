"""Matmul checks run in every process (``run_in_processes``)."""

from __future__ import annotations

from typing import Any

import numpy as np

import meshfeed
from meshfeed import ops

M, K, N = 48, 32, 24  # non-square; each divides where a strategy splits it


def normal(spec: Any) -> tuple[Any, ...]:
    """A spec without trailing Nones, one-axis tuples as the axis: comparable."""
    entries = [e[0] if isinstance(e, tuple) and len(e) == 1 else e for e in spec]
    while entries and entries[-1] is None:
        entries.pop()
    return tuple(entries)


def operands() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return (
        rng.normal(size=(M, K)).astype(np.float32),
        rng.normal(size=(K, N)).astype(np.float32),
    )


def check_strategies(axes: dict[str, int]) -> dict[str, Any]:
    """Per strategy: the largest relative error of the local shards, and the spec."""
    mesh = meshfeed.make_mesh(**axes)  # type: ignore[arg-type]
    a, b = operands()
    want = a.astype(np.float64) @ b.astype(np.float64)
    out = {}
    for strategy in ops.MATMUL_STRATEGIES:
        if strategy == "2d" and len(axes) != 2:
            continue
        c = ops.matmul(a, b, mesh=mesh, strategy=strategy)
        worst = 0.0  # normwise: the largest error over the largest entry of the product
        scale = float(np.max(np.abs(want)))
        for shard in c.addressable_shards:
            got = np.asarray(shard.data, np.float64)
            worst = max(worst, float(np.max(np.abs(got - want[shard.index]))) / scale)
        spec = c.sharding.spec  # type: ignore[attr-defined]  # a NamedSharding
        out[strategy] = {"error": worst, "spec": normal(spec), "shape": c.shape}
    return out
