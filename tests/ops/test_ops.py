"""meshfeed.ops.matmul: every strategy equals a @ b, in its documented layout."""

from __future__ import annotations

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import meshfeed
from meshfeed import ops
from meshfeed.testing import run_in_processes
from ops_fns import M, N, check_strategies, normal, operands

SPECS_2D = {
    "replicated": P(),
    "rows": P(("data", "model"), None),
    "allgather": P(),
    "reduce_scatter": P(("data", "model"), None),
    "2d": P("data", "model"),
}


def _check(results, expected_strategies):
    assert sorted(results) == sorted(expected_strategies)
    for strategy, result in results.items():
        assert result["error"] < 1e-5, strategy
        assert tuple(result["shape"]) == (M, N)


def test_every_strategy_on_a_1d_mesh():
    results = check_strategies({"data": 8})
    _check(results, ["replicated", "rows", "allgather", "reduce_scatter", "auto"])
    assert results["rows"]["spec"] == normal(P("data", None))


def test_every_strategy_on_a_2d_mesh_in_its_documented_layout():
    results = check_strategies({"data": 4, "model": 2})
    _check(results, ops.MATMUL_STRATEGIES)
    for strategy, spec in SPECS_2D.items():
        assert results[strategy]["spec"] == normal(spec), strategy


@pytest.mark.multiprocess
def test_every_strategy_across_two_processes():
    for results in run_in_processes(
        check_strategies, {"data": 4, "model": 2}, num_processes=2, devices_per_process=4
    ):
        _check(results, ops.MATMUL_STRATEGIES)


def test_shapes_that_do_not_divide_are_refused():
    mesh = meshfeed.make_mesh(data=8)
    a, b = operands()
    with pytest.raises(ValueError, match=r"'rows' splits a's rows \(50\) over the 8 devices"):
        ops.matmul(np.zeros((50, 32), np.float32), b, mesh=mesh, strategy="rows")
    with pytest.raises(ValueError, match=r"needs a 2-D mesh"):
        ops.matmul(a, b, mesh=mesh, strategy="2d")
    with pytest.raises(ValueError, match=r"takes a \[M, K\] and b \[K, N\]"):
        ops.matmul(a, a, mesh=mesh, strategy="rows")
    with pytest.raises(ValueError, match="strategy='cannon' is unknown"):
        ops.matmul(a, b, mesh=mesh, strategy="cannon")  # type: ignore[arg-type]
