"""Work done once over a data set, as Ray tasks on a local Ray of 2 CPUs.

``meshfeed.index(executor="ray")``: a task per file writes the sidecars the local
executor writes, byte for byte; a re-run redoes only the files without a current index;
a bad file stops the run by name; ``meshfeed index --ray`` does the same from the command
line. ``pack(plan_executor="ray")``: a task per shard of the packing plan writes, to a
folder on S3, the files a local build writes. ``shard_images(executor="ray")``: a task
per part writes the shards one process writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import cast

import numpy as np
import pytest
import s3fs

import meshfeed
from formats_fns import write_jsonl, write_tfrecord, write_wds
from image_fns import image_folder
from meshfeed.data._pack_store import StoredPlan
from meshfeed.vision import shard_images

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


def test_a_packing_plan_built_as_ray_tasks_on_s3_is_the_files_a_local_build_writes(
    local_ray, server, tmp_path, capsys
):
    # On S3, which every node of a cluster reaches; a task per shard of the plan.
    rng = np.random.default_rng(0)
    docs = [np.full(k, i % 1000, np.int32) for i, k in enumerate(rng.integers(1, 200, 20_000))]
    local = tmp_path / "data"
    meshfeed.write_source(local, {"tokens": meshfeed.Ragged.from_list(docs)}, shard_size=4096)
    url, options = "s3://data/ray-plan", server.storage_options
    fs = s3fs.S3FileSystem(**options)
    fs.put(str(local), url, recursive=True)
    on_ray = meshfeed.pack(meshfeed.open_source(url, storage_options=options), 256, window=256,
                           plan_executor="ray")  # fmt: skip
    kept = meshfeed.pack(meshfeed.open_source(local), 256, window=256)
    assert isinstance(on_ray.plan, StoredPlan) and isinstance(kept.plan, StoredPlan)
    assert on_ray.plan.record == kept.plan.record and on_ray.fingerprint == kept.fingerprint
    mine, where = Path(kept.plan.where), on_ray.plan.where.removeprefix("s3://")
    files = sorted(p.relative_to(mine).as_posix() for p in mine.rglob("*") if p.is_file())
    assert len([f for f in files if f.startswith("done/")]) == 5  # 5 shards: 5 tasks
    assert sorted(p.removeprefix(where + "/") for p in fs.find(where)) == files
    for name in files:
        got, want = cast(bytes, fs.cat(f"{where}/{name}")), (mine / name).read_bytes()
        if name.endswith(".npy"):
            assert got == want, name
        else:  # the same entries, which behind a URL also name each file's ETag
            assert _without_etags(json.loads(got)) == json.loads(want), name
    ids = np.arange(0, len(kept), 7)
    assert on_ray[ids]["tokens"].tobytes() == kept[ids]["tokens"].tobytes()


def test_an_image_folder_sharded_as_ray_tasks_is_the_files_one_process_writes(local_ray, tmp_path):
    folder = image_folder(tmp_path / "train", per_class=8)
    on_ray = shard_images(folder, tmp_path / "ray", part_bytes=40_000, executor="ray",
                                   progress=False)  # fmt: skip
    alone = shard_images(folder, tmp_path / "alone", part_bytes=40_000, workers=0,
                                  progress=False)  # fmt: skip
    assert on_ray.complete and on_ray.ran == on_ray.parts == alone.parts >= 3
    record = json.loads((tmp_path / "ray" / "meshfeed.prepare.json").read_text())
    assert record == json.loads((tmp_path / "alone" / "meshfeed.prepare.json").read_text())
    assert meshfeed.open_source(tmp_path / "ray").classes == ["Dog", "bird", "cat"]


def _without_etags(value: object) -> object:
    if isinstance(value, dict):
        return {k: _without_etags(v) for k, v in value.items() if k != "etag"}
    if isinstance(value, list):
        return [_without_etags(v) for v in value]
    return value
