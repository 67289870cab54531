"""Real processes on 127.0.0.1 with gloo collectives: the layouts, replicas and resume."""

import time

import numpy as np
import pytest

import meshfeed
import multiprocess_fns
from layouts import LAYOUTS, check_all
from meshfeed.testing import ProcessFailedError, run_in_processes

pytestmark = pytest.mark.multiprocess


@pytest.mark.parametrize(("num_processes", "devices_per_process"), [(2, 4), (4, 2)])
def test_every_strategy_and_layout_on_several_processes(num_processes, devices_per_process):
    results = run_in_processes(
        check_all, num_processes=num_processes, devices_per_process=devices_per_process
    )
    assert len(results) == num_processes
    for per_process in results:
        assert len(per_process) == len(meshfeed.inspect.STRATEGIES) * len(LAYOUTS)
        assert all(r["steps"] == 7 for r in per_process)
    # Every process makes the same "auto" choice without talking to the others.
    assert len({tuple(r["chosen"] for r in p) for p in results}) == 1


def test_check_replicas_names_replicas_that_differ_across_processes():
    results = run_in_processes(multiprocess_fns.disagreeing_replicas)
    # Every process raises the same error, naming the array, devices and processes.
    assert results[0]["error"] == results[1]["error"]
    error = results[0]["error"]
    assert error.startswith("replicas differ: 'differ' block [0:2]: devices [0, 2048]")
    assert "on processes [0, 1] hold different data" in error


def test_state_from_two_processes_continues_under_one_and_four():
    strategies: list[meshfeed.types.Strategy] = ["per_process", "reshard"]  # in the same processes
    run_streams = multiprocess_fns.run_streams
    two = run_in_processes(run_streams, dict.fromkeys(strategies), 5, num_processes=2)
    states = {s: two[0][s]["state"] for s in strategies}
    four = run_in_processes(run_streams, states, 0, num_processes=4, devices_per_process=2)
    for strategy in strategies:
        state = states[strategy]
        assert state["topology"] == {"process_count": 2, "device_count": 8}
        assert all(r[strategy]["state"] == state for r in two)
        want = multiprocess_fns.assemble([r[strategy] for r in two])
        assert len(want) == 16 - 5
        one = multiprocess_fns.run_stream(state, 0, strategy)
        uninterrupted = multiprocess_fns.run_stream(None, 0, strategy)
        on_four = multiprocess_fns.assemble([r[strategy] for r in four])
        for got in (multiprocess_fns.assemble([one]), on_four):
            assert len(got) == len(want), strategy
            for g, w in zip(got, want, strict=True):
                for name in w:
                    np.testing.assert_array_equal(g[name], w[name], err_msg=strategy)
        for g, w in zip(multiprocess_fns.assemble([uninterrupted])[5:], want, strict=True):
            np.testing.assert_array_equal(g["label"], w["label"], err_msg=strategy)


def test_run_in_processes_returns_results_in_process_order():
    assert run_in_processes(multiprocess_fns.psum_of_process_ids) == [4.0, 4.0]


def test_a_failing_process_stops_the_run_with_its_traceback():
    start = time.monotonic()
    with pytest.raises(
        ProcessFailedError, match=r"(?s)process 1 of 2 failed.*process one gives up"
    ):
        run_in_processes(multiprocess_fns.fail_on_process_one, timeout_s=120)
    assert time.monotonic() - start < 60
