"""worker_type="ray": record workers as Ray actors on a cluster of several nodes, the
same bytes as any other workers, nothing lost or twice when a worker or a node dies.

The cluster is Ray's own ``ray.cluster_utils.Cluster`` on this machine: a head with no
CPUs and worker nodes with a custom resource ``records`` the tests' workers reserve,
so they run on the worker nodes only, as they would on CPU-only machines.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import ray_fns as fns

import meshfeed
from meshfeed.testing import run_in_processes
from multiprocess_fns import assemble

ray = pytest.importorskip("ray", reason="worker_type='ray' needs the ray extra")
# Ray starts its node processes with a preexec_fn, so Python runs JAX's at-fork hook,
# which warns about forking a process that runs JAX's threads: the children exec at once.
pytestmark = pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")

HELPERS = Path(__file__).resolve().parents[1] / "helpers"


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    node = c.add_node(num_cpus=2, resources={"records": 4})
    ray.init(address=c.address)
    yield SimpleNamespace(cluster=c, node=node, address=c.address)
    ray.shutdown()
    c.shutdown()


def _batches(feed: meshfeed.Loader, steps: int | None = None) -> list[dict[str, np.ndarray]]:
    out = []
    for batch in feed:
        out.append({k: np.asarray(v) for k, v in batch.items()})
        if steps is not None and len(out) == steps:
            break
    return out


def _assert_same(got: list[dict[str, np.ndarray]], want: list[dict[str, np.ndarray]]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert sorted(g) == sorted(w)
        for name in w:
            np.testing.assert_array_equal(g[name], w[name])


@pytest.fixture(scope="module")
def clean():
    """Two epochs with no workers: the bytes every other run must give."""
    feed = fns.loader()
    return _batches(feed)


def test_ray_workers_give_the_batches_of_process_workers_and_of_none(cluster, clean):
    for kind, workers in (("processes", 2), (fns.ON_WORKER_NODES, 3)):
        feed = fns.loader(num_workers=workers, worker_type=kind)
        try:
            _assert_same(_batches(feed), clean)
        finally:
            feed.close()


def test_every_label_once_per_epoch(cluster):
    feed = fns.loader(num_workers=2, worker_type=fns.ON_WORKER_NODES)
    try:
        labels = [b["label"][b["mask"]] for b in _batches(feed)]
    finally:
        feed.close()
    records = feed.stats()["record_transform"]  # counted as the workers' rows come back
    assert records["records"] == 2 * fns.N and records["worker_type"] == "ray"
    assert records["seconds"] > 0  # the workers' time (their reads of the source too)
    steps = len(labels) // 2
    for epoch in (labels[:steps], labels[steps:]):
        assert sorted(np.concatenate(epoch).tolist()) == list(range(fns.N))


@pytest.mark.parametrize("first", ["ray", "processes"])
def test_a_state_moves_between_ray_and_local_workers(cluster, clean, first):
    kinds = {"ray": fns.ON_WORKER_NODES, "processes": "processes"}
    second = "processes" if first == "ray" else "ray"
    feed = fns.loader(num_workers=2, worker_type=kinds[first])
    try:
        _batches(feed, 7)
        state = feed.state()
    finally:
        feed.close()
    other = fns.loader(num_workers=2, worker_type=kinds[second])
    try:
        other.restore(state)
        _assert_same(_batches(other), clean[7:])
    finally:
        other.close()


def test_ray_workers_open_a_parquet_file_and_a_meshfeed_folder_themselves(cluster, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = fns.source()[np.arange(fns.N)]
    images = pa.FixedSizeListArray.from_arrays(data["image"].reshape(-1), 144)
    pq.write_table(pa.table({"image": images, "label": data["label"]}), tmp_path / "t.parquet")
    meshfeed.write_source(str(tmp_path / "folder"), data)
    for source in (
        meshfeed.sources.ParquetSource(str(tmp_path / "t.parquet")),
        meshfeed.open_source(str(tmp_path / "folder")),
    ):
        want = _batches(fns.loader(fns.flat_decode, data=source))  # read here, no workers
        feed = fns.loader(
            fns.flat_decode, data=source, num_workers=2, worker_type=fns.ON_WORKER_NODES
        )
        try:
            _assert_same(_batches(feed), want)
        finally:
            feed.close()


@pytest.mark.parametrize("bad", ["transform", "read"])
def test_bad_records_are_skipped_as_by_process_workers(cluster, bad):
    import bad_record_fns

    def kwargs() -> dict[str, Any]:
        if bad == "read":  # the source raises: the Ray worker finds the bad ones itself
            source = bad_record_fns.BadReads(bad_record_fns.source())
            return {"source_": source, "fn": fns.crop}
        return {}

    local = bad_record_fns.stream(num_workers=2, **kwargs())
    on_ray = bad_record_fns.stream(num_workers=2, worker_type=fns.ON_WORKER_NODES, **kwargs())
    assert on_ray == local
    assert len(local[1]) == 4


def test_workers_the_cluster_has_no_room_for_leave_their_work_to_the_others(cluster, clean, capfd):
    feed = fns.loader(num_workers=5, worker_type=fns.ON_WORKER_NODES)  # room for 4
    try:
        _assert_same(_batches(feed), clean)
    finally:
        feed.close()
    err = capfd.readouterr().err
    assert "5 Ray record workers need 2.5 CPU, 5 records, but the Ray cluster has 2 CPU, 4 " in err


def _worker_pids() -> list[int]:
    import psutil

    return [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if any("ray::RecordWorker" in part for part in p.info["cmdline"] or [])
    ]


def test_a_worker_killed_mid_epoch_costs_nothing(cluster, clean, capfd):
    feed = fns.loader(fns.slow_decode, num_workers=2, worker_type=fns.ON_WORKER_NODES)
    try:
        got = _batches(feed, 3)
        before = _worker_pids()
        assert len(before) == 2, before
        os.kill(before[0], 9)
        got += _batches(feed)
    finally:
        feed.close()
    _assert_same(got, clean)
    err = capfd.readouterr().err
    assert err.count("was lost") == 1, err
    assert "chunks in hand are computed again on the other workers" in err


def test_a_node_removed_mid_epoch_costs_nothing(cluster, clean, capfd):
    feed = fns.loader(fns.slow_decode, num_workers=2, worker_type=fns.ON_WORKER_NODES)
    try:
        got = _batches(feed, 3)  # every worker is on the one worker node
        old = cluster.node
        cluster.node = cluster.cluster.add_node(num_cpus=2, resources={"records": 4})
        cluster.cluster.remove_node(old)
        got += _batches(feed)
    finally:
        feed.close()
    _assert_same(got, clean)
    err = capfd.readouterr().err
    assert err.count("was lost") == 2, err


def test_no_worker_left_is_an_error_after_replace_s(cluster):
    lonely = cluster.cluster.add_node(num_cpus=1, resources={"lonely": 2})
    options = meshfeed.types.RayOptions(cpus=0.5, resources={"lonely": 1}, replace_s=3)
    feed = fns.loader(fns.slow_decode, num_workers=2, worker_type=options)
    try:
        _batches(feed, 2)
        cluster.cluster.remove_node(lonely)
        start = time.monotonic()
        with pytest.raises(RuntimeError, match="no Ray record worker is left: 2 were lost") as e:
            _batches(feed)
        assert time.monotonic() - start < 30
        assert "reserves 0.5 CPUs and {'lonely': 1}; add nodes" in str(e.value)
    finally:
        feed.close()


@pytest.mark.multiprocess
def test_two_processes_on_ray_give_the_batches_of_one_on_process_workers(cluster, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", cluster.address)
    got = run_in_processes(_two, num_processes=2, devices_per_process=4)
    two = assemble([{"batches": r} for r in got])
    want = assemble([{"batches": fns.shards(num_workers=2)}])
    _assert_same(two, want)


def _two() -> list[dict[str, Any]]:
    return fns.shards(num_workers=2, worker_type=fns.ON_WORKER_NODES)


def test_an_unreachable_ray_address_is_named_within_connect_s():
    code = (
        f"import sys; sys.path.insert(0, {str(HELPERS)!r})\n"
        "import meshfeed, ray_fns\n"
        "ray_fns.loader(num_workers=2, worker_type=meshfeed.types.RayOptions(connect_s=3))\n"
    )
    env = {**os.environ, "RAY_ADDRESS": "127.0.0.1:9", "JAX_PLATFORMS": "cpu"}
    start = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    took = time.monotonic() - start
    assert run.returncode != 0
    assert took < 30, took  # 3 s of tries, and the start of a process
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("ConnectionError: the Ray cluster at RAY_ADDRESS='127.0.0.1:9' "
                           "cannot be reached"), run.stderr  # fmt: skip


def test_a_local_ray_of_the_loaders_own_gives_the_same_bytes():
    code = (
        f"import sys; sys.path.insert(0, {str(HELPERS)!r})\n"
        "import numpy as np, ray, ray_fns\n"
        "def run(**kw):\n"
        "    feed = ray_fns.loader(**kw)\n"
        "    out = [{k: np.asarray(v) for k, v in b.items()} for b in feed]\n"
        "    feed.close()\n"
        "    return out\n"
        "want, got = run(), run(num_workers=2, worker_type='ray')\n"
        "assert ray.is_initialized() and len(got) == len(want)\n"
        "for g, w in zip(got, want):\n"
        "    for k in w: np.testing.assert_array_equal(g[k], w[k])\n"
        "print('same', len(got))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "same 20", run.stdout


def test_without_ray_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match=r"pip install 'meshfeed\[ray\]'"):
        fns.loader(num_workers=2, worker_type="ray")


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"cpus": -1}, ValueError, "RayOptions(cpus=-1) must be >= 0."),
        ({"cpus": "2"}, TypeError, "RayOptions(cpus='2') must be a number of CPUs."),
        (
            {"resources": {"decode": 0}},
            TypeError,
            "RayOptions(resources={'decode': 0}) must map resource names to amounts > 0, "
            'e.g. {"decode": 1}.',
        ),
        ({"connect_s": 0}, ValueError, "RayOptions(connect_s=0) must be a number of seconds > 0."),
    ],
)
def test_bad_ray_options_are_named(kwargs, error, message):
    with pytest.raises(error) as raised:
        meshfeed.types.RayOptions(**kwargs)
    assert str(raised.value) == message


def test_an_unknown_worker_type_names_ray_too():
    with pytest.raises(
        ValueError, match=r"pass 'processes', 'threads', 'ray' or meshfeed\.types\.RayOptions"
    ):
        fns.loader(num_workers=2, worker_type="cluster")


def test_records_dropped_by_a_transform_are_the_rows_dropped_without_workers(cluster):
    import filter_fns

    def dropping(**kwargs: Any) -> list[dict[str, np.ndarray]]:
        feed = fns.loader(filter_fns.drop_thirds, data=filter_fns.source(120), **kwargs)
        try:
            batches = _batches(feed)
            assert feed.filtered == 2 * 40  # two epochs of ids 0, 3, .., 117
            return batches
        finally:
            feed.close()

    _assert_same(dropping(num_workers=3, worker_type=fns.ON_WORKER_NODES), dropping())


def test_select_on_ray_gives_the_selection_of_this_process(cluster, tmp_path, monkeypatch):
    import importlib

    import filter_fns

    monkeypatch.setattr(importlib.import_module("meshfeed.prepare._select_part"), "PART", 100)
    source = filter_fns.source(1000)  # 10 parts, a Ray task each
    on_ray = meshfeed.select(source, filter_fns.high, executor="ray", cache_dir=tmp_path / "r",
                             progress=False)  # fmt: skip
    here = meshfeed.select(source, filter_fns.high, workers=0, cache_dir=tmp_path / "h")
    assert on_ray.key == here.key and len(on_ray) == 400
    np.testing.assert_array_equal(on_ray.kept, here.kept)


def test_cheap_steps_go_whole_to_a_worker_and_slow_ones_to_both(cluster):
    """A Ray call costs the loading process ~1 ms: with the read-ahead full, a step of
    cheap records is one call; a step of slow ones is cut so both workers share it."""

    def workers_a_step(fn: Any) -> list[int]:
        feed = fns.loader(fn, num_workers=2, worker_type=fns.ON_WORKER_NODES,
                          global_batch_size=64, prefetch=4, num_epochs=4)  # fmt: skip
        try:
            batches = _batches(feed)
        finally:
            feed.close()
        labels = np.concatenate([b["label"][b["mask"]] for b in batches])
        assert sorted(labels.tolist()) == sorted(list(range(fns.N)) * 4)
        return [len(np.unique(b["pid"][b["mask"]])) for b in batches[4:]]

    cheap, slow = workers_a_step(fns.whose), workers_a_step(fns.slow_whose)
    assert cheap.count(1) >= 0.75 * len(cheap), cheap
    assert slow.count(2) >= 0.75 * len(slow), slow
