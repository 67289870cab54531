"""``meshfeed.index(executor="ray")``: a Ray task per file, on a local Ray of 2 CPUs,
writes the sidecars the local executor writes, byte for byte; a re-run redoes only the
files without a current index; a bad file stops the run by name; ``meshfeed index --ray``
does the same from the command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import meshfeed
from formats_fns import write_jsonl, write_tfrecord, write_wds

ray = pytest.importorskip("ray", reason="executor='ray' needs the ray extra")
# Ray starts its node processes with a preexec_fn, so Python runs JAX's at-fork hook,
# which warns about forking a process that runs JAX's threads: the children exec at once.
pytestmark = pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")

SUFFIX = ".meshfeed-index.npz"


@pytest.fixture(scope="module")
def local_ray():
    # A Ray of its own (address="local"), whatever else runs on this machine.
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _files(folder: Path) -> list[str]:
    return [
        *write_wds(folder / "wds"),
        *write_jsonl(folder / "jsonl", "plain"),
        *write_jsonl(folder / "gz", "gz"),
        *write_tfrecord(folder / "tfrecord"),
    ]


def _sidecars(index_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(index_dir.iterdir())}


def test_bad_executor_and_ray_missing_are_refused_before_any_io(tmp_path, monkeypatch):
    missing = str(tmp_path / "none" / "x.tar")
    with pytest.raises(ValueError, match=r"executor='dask' must be 'local' .* or 'ray'"):
        meshfeed.index(missing, executor="dask")  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    with pytest.raises(ImportError, match=r"pip install 'meshfeed\[ray\]'"):
        meshfeed.index(missing, executor="ray")


def test_the_command_with_ray(tmp_path):
    # In a process of its own, which starts a Ray of its own (no RAY_ADDRESS): never one
    # that another program on this machine registered.
    paths = write_jsonl(tmp_path, "plain")
    run = subprocess.run(
        [sys.executable, "-m", "meshfeed", "index", *paths, "--ray"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "indexed 3 files" in run.stdout
    assert all(Path(p + SUFFIX).exists() for p in paths)
    assert all(f"index: {p} (" in run.stderr for p in paths)


def test_ray_writes_the_local_executors_sidecars_and_resumes_per_file(local_ray, tmp_path, capsys):
    paths = _files(tmp_path / "data")
    local = meshfeed.index(paths, index_dir=tmp_path / "local", progress=False)
    report = meshfeed.index(paths, index_dir=tmp_path / "ray", executor="ray")
    assert sorted(report.indexed) == sorted(paths) and report.current == []
    assert report.samples == local.samples
    assert _sidecars(tmp_path / "ray") == _sidecars(tmp_path / "local")
    progress = capsys.readouterr().err
    assert all(f"index: {p} (" in progress for p in paths)  # a line per file, as locally
    # Resume per file: only the file whose sidecar is gone is indexed again (the
    # catalog over them all is written again).
    sidecars = sorted(p for p in (tmp_path / "ray").iterdir() if p.name != "meshfeed.catalog.json")
    stamps = {p: p.stat().st_mtime_ns for p in sidecars}
    sidecars[2].unlink()
    again = meshfeed.index(paths, index_dir=tmp_path / "ray", executor="ray", progress=False)
    assert len(again.indexed) == 1 and len(again.current) == len(paths) - 1
    assert sidecars[2].name.startswith(Path(again.indexed[0]).name + ".")
    assert sidecars[2].exists()
    assert [p for p in sidecars if p.stat().st_mtime_ns != stamps[p]] == [sidecars[2]]
    assert _sidecars(tmp_path / "ray") == _sidecars(tmp_path / "local")
    # Indexes beside the files, read back by the sources.
    meshfeed.index(paths, executor="ray", progress=False)
    tar = [p for p in paths if p.endswith(".tar")]
    assert len(meshfeed.sources.TarSource(tar)) == 90


def test_a_bad_file_stops_the_run_by_name(local_ray, tmp_path):
    (good,) = write_tfrecord(tmp_path, files=1)
    shard = Path(write_wds(tmp_path / "wds", per_shard=90)[0])
    cut = tmp_path / "cut.tar"
    cut.write_bytes(shard.read_bytes()[:5000])
    with pytest.raises(ValueError, match=r"cut.tar: truncated: it stops after member"):
        meshfeed.index([good, str(cut)], executor="ray", progress=False)
