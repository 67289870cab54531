import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshfeed
import multiprocess_fns
from layouts import make_layout
from meshfeed.testing import run_in_processes


def test_single_process_costs():
    plan = meshfeed.inspect.plan(
        NamedSharding(meshfeed.make_mesh(data=8), P("data")), (256, 784), "uint8"
    )
    assert plan.choice == "per_process" and "one process" in plan.reason
    per_process = plan.costs["per_process"]
    assert per_process.rows_read == {0: 256}
    assert per_process.bytes_read == {0: 256 * 784}
    assert per_process.host_to_device == {0: 256 * 784}
    assert plan.costs["reshard"].device_to_device == 0  # load layout == target layout
    assert "auto -> per_process" in str(plan)
    assert plan.across_processes == ()
    assert "mesh axes across processes: none\n" in meshfeed.show_plan(plan)


def test_replicas_across_processes_cost_reads_that_reshard_saves():
    spread = make_layout("data4_model2")["image"]  # model replicas on other processes
    plan = meshfeed.inspect.plan(spread, (16, 4, 4), np.uint8, processes=2)
    assert plan.choice == "global" and "replicated across processes" in plan.reason
    assert plan.costs["per_process"].rows_read == {0: 16, 1: 16}
    assert plan.costs["reshard"].rows_read == {0: 8, 1: 8}
    assert plan.costs["reshard"].device_to_device > 0
    assert plan.across_processes == ("model",)
    assert "mesh axes across processes: model\n" in meshfeed.show_plan(plan)
    four = meshfeed.inspect.plan(spread, (16, 4, 4), np.uint8, processes=4)
    assert four.costs["per_process"].rows_read == {0: 8, 1: 8, 2: 8, 3: 8}
    assert "read more than once" in four.reason


@pytest.mark.multiprocess
@pytest.mark.parametrize(("num_processes", "devices"), [(2, 4), (4, 2)])
def test_plan_rows_are_the_rows_the_source_is_asked_for(num_processes, devices):
    results = run_in_processes(
        multiprocess_fns.plan_against_reads,
        num_processes=num_processes,
        devices_per_process=devices,
    )
    for per_process in results:
        for layout, strategy, said, read in per_process:
            assert said == read, (layout, strategy, said, read)


def test_plan_rejects_bad_input():
    with pytest.raises(TypeError, match="pass a NamedSharding"):
        meshfeed.inspect.plan(P("data"), (8,))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no batch dimension"):
        meshfeed.inspect.plan(NamedSharding(meshfeed.make_mesh(data=8), P()), ())
