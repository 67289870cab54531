"""The packing plan as data: built once beside a folder (or in ``plan_dir``), read by range
by every later ``pack`` on any host, the same rows and digest as the plan made in memory;
concurrent first opens agree; a plan over changed documents is refused by name."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import cast

import numpy as np
import pytest
import s3fs

import meshfeed
from meshfeed.data._files import RaggedRows
from meshfeed.data._pack_store import PLAN_FOLDER, StoredPlan
from meshfeed.testing import CountingProxy

PLANNING = "meshfeed: planning the packing of"


def _documents(folder: Path, n: int, seed: int = 0, shard_size: int = 4096) -> Path:
    rng = np.random.default_rng(seed)
    docs = [np.full(k, i % 1000, np.int32) for i, k in enumerate(rng.integers(1, 200, n))]
    meshfeed.write_source(folder, {"tokens": meshfeed.Ragged.from_list(docs)},
                          shard_size=shard_size)  # fmt: skip
    return folder


def _same_rows(a: meshfeed.sources.Packed, b: meshfeed.sources.Packed, ids: np.ndarray) -> None:
    got, want = a[ids], b[ids]
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_a_folders_plan_is_built_once_then_read_with_the_rows_and_digest_of_memorys(
    tmp_path, capsys
):
    data = _documents(tmp_path / "data", 20_000)
    memory = meshfeed.pack(meshfeed.open_source(data), 256, plan_dir=False)
    first = meshfeed.pack(meshfeed.open_source(data), 256)
    assert capsys.readouterr().err.count(PLANNING) == 1
    again = meshfeed.pack(meshfeed.open_source(data), 256)
    assert PLANNING not in capsys.readouterr().err  # read, not planned
    assert isinstance(again.plan, StoredPlan) and len(os.listdir(data / PLAN_FOLDER)) == 1
    ids = np.random.default_rng(1).integers(0, len(memory), 300)
    for packed in (first, again):
        assert len(packed) == len(memory) and packed.stats() == memory.stats()
        assert packed.fingerprint == memory.fingerprint and packed.pieces(7) == memory.pieces(7)
        _same_rows(packed, memory, ids)
    # A state taken over the in-memory plan restores over the kept one.
    mesh = meshfeed.make_mesh(data=8)
    loaders = [meshfeed.Loader(p, global_batch_size=16, sharding=meshfeed.batch_sharding(mesh),
                               seed=2) for p in (memory, again)]  # fmt: skip
    for _ in zip(range(5), loaders[0], strict=False):
        pass
    loaders[1].restore(loaders[0].state())
    np.testing.assert_array_equal(loaders[1].ids(5), loaders[0].ids(5))
    # Other settings: another plan beside it.
    meshfeed.pack(meshfeed.open_source(data), 128)
    assert len(os.listdir(data / PLAN_FOLDER)) == 2


def test_two_processes_opening_an_unbuilt_plan_at_once_get_one_plan_and_the_same_rows(
    tmp_path,
):
    data = _documents(tmp_path / "data", 200_000)
    go = tmp_path / "go"
    script = (
        "import sys, os, time, hashlib, numpy as np, meshfeed\n"
        "open(sys.argv[2] + '.' + str(os.getpid()), 'w').close()\n"
        "while not os.path.exists(sys.argv[2]): time.sleep(0.001)\n"  # both start at once
        "p = meshfeed.pack(meshfeed.open_source(sys.argv[1]), 512)\n"
        "rows = p[np.arange(0, len(p), 97)]\n"
        "print(len(p), hashlib.sha256(rows['tokens'].tobytes()).hexdigest(), p.plan.digest())\n"
    )
    runs = [subprocess.Popen([sys.executable, "-c", script, str(data), str(go)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]  # fmt: skip
    while len(list(tmp_path.glob("go.*"))) < 2 and all(r.poll() is None for r in runs):
        time.sleep(0.01)
    go.touch()
    outs = [r.communicate(timeout=300) for r in runs]
    assert all(r.returncode == 0 for r in runs), [o[1][-2000:] for o in outs]
    assert outs[0][0] == outs[1][0]
    # Usually both find no plan and build it, writing the same files; one that finds the
    # other's finished plan reads it. Either way: one plan, the same rows.
    assert any(PLANNING in o[1] for o in outs)
    assert len(os.listdir(data / PLAN_FOLDER)) == 1
    memory = meshfeed.pack(meshfeed.open_source(data), 512, plan_dir=False)
    assert outs[0][0].split() == [str(len(memory)), outs[0][0].split()[1], memory.plan.digest()]


def test_a_plan_over_changed_documents_is_refused_by_name_and_built_again_on_request(
    tmp_path, capsys
):
    data = _documents(tmp_path / "data", 5_000)
    meshfeed.pack(meshfeed.open_source(data), 256)
    os.remove(data / "meshfeed.json")  # the same folder, other documents; the plan stays
    shutil.rmtree(data / "tokens")
    _documents(data, 5_000, seed=1)
    with pytest.raises(ValueError, match=r"made from other documents than .*data holds now"):
        meshfeed.pack(meshfeed.open_source(data), 256)
    out = subprocess.run(
        [sys.executable, "-m", "meshfeed", "pack", str(data), "--seq-len", "256", "--rebuild"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["plan"].startswith(str(data / PLAN_FOLDER))
    memory = meshfeed.pack(meshfeed.open_source(data), 256, plan_dir=False)
    capsys.readouterr()
    kept = meshfeed.pack(meshfeed.open_source(data), 256)
    assert PLANNING not in capsys.readouterr().err and kept.fingerprint == memory.fingerprint


def test_plan_dir_keeps_it_elsewhere_and_an_unwritable_place_plans_in_memory(tmp_path, capsys):
    data = _documents(tmp_path / "data", 3_000)
    kept = meshfeed.pack(meshfeed.open_source(data), 128, plan_dir=tmp_path / "plans")
    assert isinstance(kept.plan, StoredPlan) and not (data / PLAN_FOLDER).exists()
    assert len(os.listdir(tmp_path / "plans")) == 1
    (data / PLAN_FOLDER).write_text("in the way")  # where the plan would go is not a folder
    packed = meshfeed.pack(meshfeed.open_source(data), 128)
    assert "cannot keep the packing plan" in capsys.readouterr().err
    assert not isinstance(packed.plan, StoredPlan) and packed.fingerprint == kept.fingerprint
    with pytest.raises(ValueError, match="plan_dir= keeps the plan of a meshfeed folder"):
        source = meshfeed.ArraySource({"tokens": meshfeed.Ragged.from_list([[1, 2], [3]])})
        meshfeed.pack(source, 4, plan_dir=tmp_path / "plans")


@pytest.mark.parametrize("documents", [10_000, 100_000])
def test_a_packed_folder_on_s3_opens_with_three_requests_whatever_its_size(
    server, tmp_path, documents
):
    url = f"s3://data/packed-{documents}"
    local = _documents(tmp_path / "data", documents, shard_size=16_384)
    s3fs.S3FileSystem(**server.storage_options).put(str(local), url, recursive=True)
    meshfeed.pack(meshfeed.open_source(url, storage_options=server.storage_options), 512)
    proxy = CountingProxy(server.port)
    try:
        options = {**server.storage_options, "endpoint_url": proxy.endpoint}
        proxy.reset()
        packed = meshfeed.pack(meshfeed.open_source(url, storage_options=options), 512)
        # The data's manifest, the plan's manifest, and that again as its folder opens.
        assert proxy.counts()["total"] == 3 and proxy.counts()["head"] == 0
        assert packed[np.array([0, len(packed) - 1])]["tokens"].shape == (2, 512)
    finally:
        proxy.close()


def test_a_few_scattered_documents_read_their_offsets_by_range_not_the_whole_array(tmp_path):
    """A packed row's documents are scattered over the corpus: reading them costs their
    own offsets, not each shard's whole array (8 bytes a document), until the shard has
    served one in 64 of its documents; then it loads the array once."""
    data = _documents(tmp_path / "data", 100_000, shard_size=100_000)
    want = meshfeed.open_source(data)
    want.lengths("tokens")  # loaded whole: the reference
    source = meshfeed.open_source(data)
    rows = cast(RaggedRows, source._shards[0]["tokens"])  # type: ignore[attr-defined]
    ids = np.array([99_999, 5, 6, 7, 50_000, 5, 12_345])
    got = source[ids]["tokens"]
    assert got.to_list() and [a.tolist() for a in got.to_list()] == [
        a.tolist() for a in want[ids]["tokens"].to_list()
    ]
    assert rows._offsets is None and rows.offsets_file.bytes_read <= 8 * 16
    rng = np.random.default_rng(0)
    for _ in range(15):  # a shard in use: past one in 64 of its documents, read whole
        source[rng.integers(0, 100_000, 100)]
    assert rows._offsets is None
    source[rng.integers(0, 100_000, 100)]
    assert rows._offsets is not None and len(rows._offsets) == 100_001


def test_a_build_on_two_workers_is_the_same_plan_and_a_stopped_one_goes_on_from_its_shards(
    tmp_path,
):
    data = _documents(tmp_path / "data", 100_000)
    memory = meshfeed.pack(meshfeed.open_source(data), 256, window=2048, plan_dir=False)
    kept = meshfeed.pack(meshfeed.open_source(data), 256, window=2048, plan_workers=2)
    assert isinstance(kept.plan, StoredPlan) and kept.fingerprint == memory.fingerprint
    folder = Path(kept.plan.where)
    done = sorted((folder / "done").iterdir())
    assert len(done) == 4  # 100,000 documents in shards of 16 windows of 2,048
    # Stopped before its manifest, with one shard unfinished: only that one is redone.
    (folder / "meshfeed.json").unlink()
    done[2].unlink()
    before = {p.name: p.stat().st_mtime_ns for p in done if p.exists()}
    again = meshfeed.pack(meshfeed.open_source(data), 256, window=2048)
    assert again.fingerprint == memory.fingerprint and len(again) == len(memory)
    assert {p.name: p.stat().st_mtime_ns for p in done if p.name in before} == before
    assert done[2].exists()
    _same_rows(again, memory, np.arange(0, len(memory), 13))


def test_pack_refuses_an_unknown_plan_executor_and_names_the_ray_extra(tmp_path, monkeypatch):
    data = _documents(tmp_path / "data", 100)
    with pytest.raises(ValueError, match=r"plan_executor='dask' must be 'local' .* or 'ray'"):
        meshfeed.pack(meshfeed.open_source(data), 64, plan_executor="dask")  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    with pytest.raises(ImportError, match=r"pack\(plan_executor='ray'\) needs Ray: pip install"):
        meshfeed.pack(meshfeed.open_source(data), 64, plan_executor="ray")
    assert not (data / PLAN_FOLDER).exists()  # refused before any planning
