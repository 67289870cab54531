"""Record workers and run_in_processes run a function defined anywhere: a script without
a main guard, stdin, a closure; nothing of the user's script runs again in a worker."""

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import meshfeed
import record_fns
from multiprocess_fns import assemble

SHM = Path("/dev/shm")

SCRIPT = """
import hashlib, sys
sys.path[:0] = {path!r}
import numpy as np
import meshfeed
from meshfeed.testing import run_in_processes

OFFSET = 7
print("the script ran", flush=True)  # once: workers must not run it again


def shift(record, rng):  # defined in the script, used below without a main guard
    return {{"x": record["x"] + OFFSET + rng.integers(0, 3), "y": record["y"]}}


def digest(num_workers):
    loader = meshfeed.Loader(
        meshfeed.ArraySource({{"x": np.arange(200), "y": np.arange(200) % 7}}),
        global_batch_size=16,
        sharding=meshfeed.batch_sharding(meshfeed.make_mesh(data=1)),
        record_transform=shift,
        num_workers=num_workers,
        seed=3,
    )
    h = hashlib.sha256()
    for batch in loader:
        for name in sorted(batch):
            h.update(np.asarray(batch[name]).tobytes())
    loader.close()
    return h.hexdigest()


print("same" if digest(0) == digest(2) else "different", flush=True)


def where(tag):
    import jax
    return tag, jax.process_index()


print(run_in_processes(where, "t", num_processes=2, devices_per_process=1), flush=True)
"""


def _segments():
    return {p.name for p in SHM.glob("psm_*")} if SHM.exists() else set()


def _run(tmp_path, how):
    code = textwrap.dedent(SCRIPT.format(path=sys.path))
    env = {"XLA_FLAGS": "", "PATH": "/usr/bin:/bin"}
    if how == "script":
        script = tmp_path / "train.py"
        script.write_text(code)
        argv, stdin = [sys.executable, str(script)], None
    else:
        argv, stdin = [sys.executable, "-"], code
    return subprocess.run(
        argv, input=stdin, capture_output=True, text=True, env=env, timeout=240, check=False
    )


@pytest.mark.multiprocess
@pytest.mark.parametrize("how", ["script", "stdin"])
def test_functions_from_a_script_without_a_main_guard_run_in_workers(tmp_path, how):
    before = _segments()
    run = _run(tmp_path, how)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["the script ran", "same", "[('t', 0), ('t', 1)]"]
    assert _segments() <= before


def test_a_closure_runs_in_worker_processes():
    table = np.arange(1000)[::-1].astype(np.int32)  # captured: sent with the function

    def lookup(record, rng):
        return {"image": record["image"][:8, :8], "label": table[record["label"]]}

    got = assemble([{"batches": record_fns.stream(lookup, 2)}])
    want = assemble([{"batches": record_fns.stream(lookup, 0)}])
    for g, w in zip(got, want, strict=True):
        for name in w:
            np.testing.assert_array_equal(g[name], w[name])
    for batch in got:  # labels 0..99 went through the captured table
        assert (batch["label"][batch["mask"]] >= 900).all()


def test_a_function_the_workers_cannot_import_names_the_cause(tmp_path, monkeypatch):
    (tmp_path / "vanishing.py").write_text("def keep(record, rng):\n    return record\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import vanishing  # type: ignore[import-not-found]

    loader = meshfeed.Loader(
        record_fns.source(),
        global_batch_size=16,
        sharding=meshfeed.batch_sharding(meshfeed.make_mesh(data=8)),
        record_transform=vanishing.keep,
        num_workers=2,
    )
    (tmp_path / "vanishing.py").unlink()  # gone before the workers import it
    with pytest.raises(
        RuntimeError,
        match=r"record_transform worker \d could not start: ModuleNotFoundError: "
        r"No module named 'vanishing'",
    ):
        next(iter(loader))
    loader.close()
    sys.modules.pop("vanishing", None)
