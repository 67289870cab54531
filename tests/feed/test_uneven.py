"""No hangs: processes agree on steps and shapes whatever the data, and a process that
fails while loading stops the whole job with its error."""

from __future__ import annotations

import time

import pytest

from meshfeed.testing import ProcessFailedError, run_in_processes
from train_fns import fit_with_a_failing_read, steps_and_shapes

pytestmark = pytest.mark.multiprocess


def _drop_and_pad(n: int) -> dict[str, list[tuple[int, ...]]]:
    return {last_batch: steps_and_shapes(n, last_batch) for last_batch in ("drop", "pad")}


def test_processes_agree_on_steps_and_shapes_with_uneven_data():
    # 37 examples, batch 8 over 2 processes: neither the batch nor the processes divide it.
    results = run_in_processes(_drop_and_pad, 37, num_processes=2, devices_per_process=4)
    assert results[0] == results[1] == {"drop": [(8, 3)] * 4, "pad": [(8, 3)] * 5}


def test_a_read_that_fails_on_one_process_stops_the_job_with_its_error():
    start = time.monotonic()
    with pytest.raises(ProcessFailedError, match=r"(?s)process 1 of 2 failed.*disk gone"):
        run_in_processes(fit_with_a_failing_read, num_processes=2, devices_per_process=4)
    assert time.monotonic() - start < 60
