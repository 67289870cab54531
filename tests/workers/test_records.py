import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from sigint import with_sigint

import meshfeed
import record_fns
from meshfeed.testing import run_in_processes
from multiprocess_fns import assemble

SHM = Path("/dev/shm")


def _segments():
    return {p.name for p in SHM.glob("psm_*")} if SHM.exists() else set()


def _global(batches):
    return assemble([{"batches": batches}])


@pytest.fixture(scope="module")
def reference():
    return _global(record_fns.stream(record_fns.crop, 0))


@pytest.mark.parametrize(("workers", "kind"), [(1, "processes"), (2, "processes"), (2, "threads")])
def test_workers_give_the_same_output_as_the_loading_thread(workers, kind, reference):
    before = _segments()
    got = _global(record_fns.stream(record_fns.crop, workers, worker_type=kind))
    assert len(got) == len(reference) == 7
    for g, r in zip(got, reference, strict=True):
        for name in r:
            np.testing.assert_array_equal(g[name], r[name])
    assert got[0]["image"].shape == (16, 24, 24) and got[0]["image"].dtype == np.float32
    assert not got[-1]["mask"][4:].any() and not got[-1]["image"][4:].any()  # padding
    assert _segments() <= before  # the shared memory is gone


def test_each_record_sees_the_documented_generator():
    # A PCG64 in state (a << 64) | b, increment 2b + 1, set through numpy's public
    # setter: the generator the fast re-seeding (state words written in place) must equal.
    from meshfeed.workers._record_rng import RecordRng, example_keys

    ids = np.array([0, 5, -1, 123456789, 2**40])
    keys_a, keys_b = example_keys(7, 3, ids)
    rng = RecordRng()
    rng.keyed(7, 3, ids)
    for i in range(len(ids)):
        a, b = int(keys_a[i]), int(keys_b[i])
        bits = np.random.PCG64()
        bits.state = {
            "bit_generator": "PCG64",
            "state": {"state": (a << 64) | b, "inc": ((b << 1) | 1) % (1 << 128)},
            "has_uint32": 0,
            "uinteger": 0,
        }
        want = np.random.Generator(bits)
        got = rng.at(i)
        assert got.integers(0, 10, 3).tolist() == want.integers(0, 10, 3).tolist()
        assert got.random() == want.random()
        got.integers(0, 10)  # leaves half a 64-bit draw buffered: the next at() clears it
    assert rng.at(1).integers(0, 1 << 30, 5).tolist() == rng.at(1).integers(0, 1 << 30, 5).tolist()


@pytest.mark.multiprocess
def test_two_processes_give_the_same_output(reference):
    results = run_in_processes(record_fns.stream, record_fns.crop, 1, "data4_model2")
    got = assemble([{"batches": r} for r in results])
    for g, r in zip(got, reference, strict=True):
        for name in r:
            np.testing.assert_array_equal(g[name], r[name])


def test_a_raising_record_transform_names_the_example():
    before = _segments()
    with pytest.raises(RuntimeError, match=r"(?s)raised on example 17 in a worker.*cannot decode"):
        record_fns.stream(record_fns.fails_on_17, 2)
    assert _segments() <= before


WHERE = {
    "0 workers": (0, "processes", "the loading process"),
    "2 processes": (2, "processes", "a worker process"),
    "2 threads": (2, "threads", "a worker thread"),
}


def test_a_batch_form_that_raises_on_a_chunk_names_the_record_that_raises_alone():
    # Example 19 is the 2nd row of its chunk for 0 and 2 workers (step 0, row 9): the
    # chunk raises, and the record stage runs its records alone to find the one at fault.
    for workers, kind, where in WHERE.values():
        with pytest.raises(
            RuntimeError,
            match=rf"^record_transform raised on example 19 in {where}: ValueError: cannot "
            r"decode a record of this chunk of 1\b",
        ) as raised:
            record_fns.stream(record_fns.DecodesInChunks(19), workers, worker_type=kind)
        if workers == 0 or kind == "threads":  # the transform's own error, where it lives
            assert isinstance(raised.value.__cause__, ValueError)
        else:  # from another process: its traceback, as text
            assert "in batch\n    raise ValueError(" in str(raised.value)


def test_a_chunk_that_raises_where_no_record_raises_alone_is_named_as_the_chunk():
    for on_error in ("raise", "skip"):  # not a bad record: never skipped
        loader = record_fns.make_loader(
            record_fns.DecodesInChunks(19, alone_ok=True), 0, on_error=on_error
        )
        ids = ", ".join(str(i) for i in loader.ids(0)[:8].tolist())  # the chunk is step 0
        with pytest.raises(
            RuntimeError,
            match=rf"^record_transform raised on the chunk of examples {ids}, \.\.\. \(16 in "
            r"all\) in the loading process \(its batch form, on the chunk together\), but on "
            r"none of them alone: ValueError: cannot decode a record of this chunk of 16\. Its "
            r"batch\(\) must give each record what the transform gives it alone",
        ) as raised:
            list(loader)
        loader.close()
        assert isinstance(raised.value.__cause__, ValueError)


def test_a_killed_worker_is_an_error_naming_the_example():
    before = _segments()
    with pytest.raises(
        RuntimeError,
        match=r"worker \d \(pid \d+\) was killed by SIGKILL while transforming example 17\.",
    ):
        record_fns.stream(record_fns.dies_on_17, 2)
    assert _segments() <= before


def test_a_dying_worker_is_an_error_within_a_second_with_its_last_words():
    before = _segments()
    with pytest.raises(RuntimeError) as raised:
        record_fns.stream(record_fns.dies_saying_why_on_17, 2)
    noticed = time.time()
    message = str(raised.value)
    assert re.search(
        r"worker \d \(pid \d+\) exited with code 3 while transforming example 17; its last "
        r"line on stderr: 'the decoder gave up at [\d.]+'\. The loader stopped its other",
        message,
    ), message
    died = float(re.search(r"gave up at ([\d.]+)", message).group(1))  # type: ignore[union-attr]
    assert noticed - died < 1.0
    assert _segments() <= before


def test_records_of_another_shape_are_refused_with_the_example():
    # The message of any record that fails, in the loading process as in workers.
    with pytest.raises(
        RuntimeError, match=r"on example 5 in the loading process: .*for example 5, but"
    ) as raised:
        record_fns.stream(record_fns.changes_shape, 0)
    assert isinstance(raised.value.__cause__, ValueError)


SCRIPT = """
import os, sys
sys.path[:0] = {path!r}
import meshfeed, record_fns
if __name__ == "__main__":
    loader = meshfeed.Loader(
        record_fns.source(), global_batch_size=16,
        sharding=meshfeed.batch_sharding(meshfeed.make_mesh(data=1)),
        record_transform=record_fns.slow, num_workers=2, num_epochs=None,
    )
    for step, batch in enumerate(loader):
        if step == 1:
            print("running", flush=True)
"""


def test_ctrl_c_leaves_no_shared_memory(tmp_path):
    before = _segments()
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(SCRIPT.format(path=sys.path)))
    env = {**os.environ, "XLA_FLAGS": ""}
    with subprocess.Popen(
        with_sigint([sys.executable, str(script)]), stdout=subprocess.PIPE, env=env, text=True
    ) as run:
        assert run.stdout is not None
        assert run.stdout.readline().strip() == "running"
        assert _segments() - before  # the workers' block exists while running
        run.send_signal(signal.SIGINT)
        try:
            run.wait(timeout=30)
        except subprocess.TimeoutExpired:  # fail, rather than hang in Popen's exit
            run.kill()
            pytest.fail("one Ctrl-C did not end the run within 30 s")
    assert _segments() <= before


def test_bad_worker_arguments_are_refused():
    src = record_fns.source()
    sharding = meshfeed.batch_sharding(meshfeed.make_mesh(data=8))
    with pytest.raises(ValueError, match="no record_transform was given"):
        meshfeed.Loader(src, global_batch_size=16, sharding=sharding, num_workers=2)
    lock = threading.Lock()
    with pytest.raises(TypeError, match="cannot be sent to worker processes: TypeError: cannot"):
        meshfeed.Loader(
            src,
            global_batch_size=16,
            sharding=sharding,
            record_transform=lambda r, g: (lock, r)[1],
            num_workers=2,
        )
    # Threads need nothing sent: the same function is fine there.
    meshfeed.Loader(
        src,
        global_batch_size=16,
        sharding=sharding,
        record_transform=lambda r, g: (lock, r)[1],
        num_workers=2,
        worker_type="threads",
    ).close()
    with pytest.raises(ValueError, match="num_workers=-1 must be an int >= 0"):
        meshfeed.Loader(
            src,
            global_batch_size=16,
            sharding=sharding,
            record_transform=record_fns.crop,
            num_workers=-1,
        )
