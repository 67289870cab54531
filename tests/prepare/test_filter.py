"""Filters that keep every promise: ``select`` (a selection built once, cached) and a
record transform that drops an example by returning ``None`` (a masked row)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from pathlib import Path

import filter_fns
import jax
import numpy as np
import optax
import pytest

import meshfeed
from meshfeed.testing import run_in_processes
from multiprocess_fns import assemble

select_module = importlib.import_module("meshfeed.prepare._select")
parts_module = importlib.import_module("meshfeed.prepare._select_part")

HERE = Path(__file__).resolve().parent


def _kept(source: meshfeed.ArraySource, keep) -> np.ndarray:
    everything = source[np.arange(len(source))]
    return np.asarray(
        [i for i in range(len(source)) if keep({k: v[i] for k, v in everything.items()})]
    )


@pytest.fixture
def calls(monkeypatch):
    """Counts the parts run in this process."""
    count = [0]
    real = select_module.keep_part

    def counted(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(select_module, "keep_part", counted)
    return count


def _loader(source, **options) -> meshfeed.Loader:
    mesh = meshfeed.make_mesh(data=8)
    options = {"global_batch_size": 16, "seed": 5, "last_batch": "pad", **options}
    return meshfeed.Loader(source, sharding=meshfeed.batch_sharding(mesh), **options)


def test_a_loader_over_a_selection_gives_every_kept_example_once_an_epoch(tmp_path):
    source = filter_fns.source()
    selection = meshfeed.select(source, filter_fns.high, workers=0, cache_dir=tmp_path)
    want = _kept(source, filter_fns.high)
    assert 0 < len(selection) == len(want) < len(source)
    np.testing.assert_array_equal(selection.kept, want)
    assert selection.fields == source.fields
    loader = _loader(selection, num_epochs=2)
    per_epoch = len(loader) // 2
    seen = [[], []]
    for step, batch in enumerate(loader):
        ids = np.asarray(batch["id"])[np.asarray(batch["mask"])]
        seen[step // per_epoch] += ids.tolist()
        np.testing.assert_array_equal(np.asarray(batch["row"])[:, 0], np.asarray(batch["id"]))
    for epoch in seen:  # each kept example once, and nothing else
        assert sorted(epoch) == want.tolist()


@pytest.mark.multiprocess
def test_two_processes_read_the_batches_of_one_and_a_state_restores_across(tmp_path):
    cache = str(tmp_path)
    meshfeed.select(filter_fns.source(), filter_fns.high, cache_dir=cache, progress=False)
    one = filter_fns.selected_stream(cache, None, 3)  # 1 process x 8 devices
    two = run_in_processes(filter_fns.selected_stream, cache, None, 3)  # 2 x 4
    want, got = assemble([one]), assemble(two)
    assert len(want) == len(got) == 2 * one["steps_per_epoch"]
    for w, g in zip(want, got, strict=True):
        for name in w:
            np.testing.assert_array_equal(w[name], g[name])
    # A state taken on 2 x 4 after 3 steps, restored on 1 x 8 over a new select call.
    resumed = filter_fns.selected_stream(cache, two[0]["state"], -1)
    assert two[0]["state"]["step"] == 3
    for w, g in zip(want[3:], assemble([resumed]), strict=True):
        for name in w:
            np.testing.assert_array_equal(w[name], g[name])


def test_the_cache_is_reused_for_the_same_data_and_predicate_and_rebuilt_otherwise(tmp_path, calls):
    first = meshfeed.select(filter_fns.source(), filter_fns.high, workers=0, cache_dir=tmp_path)
    built = calls[0]
    again = meshfeed.select(filter_fns.source(), filter_fns.high, workers=0, cache_dir=tmp_path)
    assert calls[0] == built > 0 and again.key == first.key  # found, not run again
    np.testing.assert_array_equal(again.kept, first.kept)
    changed = filter_fns.source(shift=1)  # other scores: other data
    other = meshfeed.select(changed, filter_fns.high, workers=0, cache_dir=tmp_path)
    assert calls[0] > built and other.key != first.key
    np.testing.assert_array_equal(other.kept, _kept(changed, filter_fns.high))
    count = calls[0]
    low = meshfeed.select(filter_fns.source(), filter_fns.low, workers=0, cache_dir=tmp_path)
    assert calls[0] > count and low.key not in (first.key, other.key)
    np.testing.assert_array_equal(low.kept, _kept(filter_fns.source(), filter_fns.low))


def test_a_file_changed_in_place_is_other_data(tmp_path, calls):
    path = tmp_path / "score.npy"
    np.save(path, np.linspace(0, 1, 500, dtype=np.float32))
    keep = filter_fns.high
    source = meshfeed.ArraySource({"score": np.load(path, mmap_mode="r")})
    first = meshfeed.select(source, keep, workers=0, cache_dir=tmp_path / "cache")
    time.sleep(0.01)
    np.save(path, np.linspace(1, 0, 500, dtype=np.float32) ** 2)  # same size, new values
    source = meshfeed.ArraySource({"score": np.load(path, mmap_mode="r")})
    count = calls[0]
    second = meshfeed.select(source, keep, workers=0, cache_dir=tmp_path / "cache")
    assert calls[0] > count and second.key != first.key
    np.testing.assert_array_equal(second.kept, _kept(source, keep))


def test_a_predicate_that_raises_names_its_example(tmp_path):
    with pytest.raises(ValueError, match=r"example 17 .*ValueError: no score for this one"):
        meshfeed.select(
            filter_fns.source(), filter_fns.fails_on_17, workers=0, cache_dir=tmp_path,
            progress=False,
        )  # fmt: skip


def test_a_predicate_that_raises_in_a_worker_names_its_example(tmp_path, monkeypatch):
    monkeypatch.setattr(parts_module, "PART", 100)  # 20 parts of 0.1 s: the worker gets some
    monkeypatch.setenv("FILTER_PARENT", str(os.getpid()))
    with pytest.raises(ValueError, match=r"example \d+ of the source: ValueError: not in this"):
        meshfeed.select(
            filter_fns.source(2000), filter_fns.fails_in_a_worker, workers=2,
            cache_dir=tmp_path, progress=False,
        )  # fmt: skip


def test_this_process_and_a_worker_share_the_parts_and_the_worker_rests_for_the_next_call(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(parts_module, "PART", 100)  # 20 parts of 0.1 s
    monkeypatch.setattr(select_module, "_RESTING", select_module._Resting())
    source = filter_fns.source(2000)
    pids = tmp_path / "pids"
    pids.mkdir()
    monkeypatch.setenv("FILTER_PIDS", str(pids))
    here = meshfeed.select(source, filter_fns.slow_high_noted, workers=0, cache_dir=tmp_path / "a")
    two = meshfeed.select(source, filter_fns.slow_high_noted, workers=2, cache_dir=tmp_path / "b")
    assert two.key == here.key
    np.testing.assert_array_equal(two.kept, here.kept)
    ran = {int(p.name) for p in pids.iterdir()}
    assert os.getpid() in ran and len(ran) == 2  # this process and one worker
    (worker,) = ran - {os.getpid()}
    resting = select_module._RESTING
    assert [w.popen.pid for w in resting._workers] == [worker]

    for p in pids.iterdir():  # another predicate: the same worker serves it
        p.unlink()
    low = meshfeed.select(source, filter_fns.slow_low_noted, workers=2, cache_dir=tmp_path / "c")
    np.testing.assert_array_equal(low.kept, _kept(source, filter_fns.low))
    assert {int(p.name) for p in pids.iterdir()} == {os.getpid(), worker}

    popen = resting._workers[0].popen
    monkeypatch.setattr(select_module, "REST_S", 0.1)  # then it ends when the rest is over
    meshfeed.select(source, filter_fns.slow_high_noted, workers=2, cache_dir=tmp_path / "d")
    assert popen.wait(timeout=30) == 0
    assert not resting._workers


def test_a_source_is_cut_into_about_64_parts_and_any_worker_count_writes_the_same_bytes(
    tmp_path,
):
    """Parts are ~1/64 of a source (so processes end together), 8,192 to 65,536
    examples; 1, 2 or 3 processes write the same selection file."""
    sizes = {n: parts_module.part_size(n) for n in (100, 20_000, 200_000, 2_000_000, 10**8)}
    assert sizes == {100: 8192, 20_000: 8192, 200_000: 8192, 2_000_000: 31_250, 10**8: 65_536}
    assert parts_module.part_count(2_000_000) == 64
    source = filter_fns.source(60_000)  # 8 parts of ~0.08 s: workers are taken
    files = []
    for workers in (0, 2, 3):
        cache = tmp_path / str(workers)
        chosen = meshfeed.select(source, filter_fns.busy_high, workers=workers, cache_dir=cache,
                                 progress=False)  # fmt: skip
        files.append((cache / "selections" / chosen.key / "selection.npy").read_bytes())
    assert files[0] == files[1] == files[2]
    np.testing.assert_array_equal(chosen.kept, _kept(source, filter_fns.high))


KILLED = """
import sys
sys.path[:0] = {path!r}
import filter_fns, meshfeed
import importlib
importlib.import_module("meshfeed.prepare._select_part").PART = 100
meshfeed.select(filter_fns.source(2000), filter_fns.slow_high, workers=0, cache_dir={cache!r},
                progress=False)
"""


def test_a_killed_select_goes_on_where_it_stopped_and_gives_the_same_selection(
    tmp_path, calls, monkeypatch
):
    cache = str(tmp_path / "cache")
    run = subprocess.Popen([sys.executable, "-c", KILLED.format(path=sys.path, cache=cache)])
    folders = tmp_path / "cache" / "selections"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(folders.glob("*/parts/*.npy"))) < 3:
        time.sleep(0.02)
    run.kill()
    run.wait()
    written = len(list(folders.glob("*/parts/*.npy")))
    assert 3 <= written < 20  # killed half way: 3 or more of the 20 parts written
    monkeypatch.setattr(parts_module, "PART", 100)
    source = filter_fns.source(2000)
    resumed = meshfeed.select(source, filter_fns.slow_high, workers=0, cache_dir=cache,
                              progress=False)  # fmt: skip
    assert calls[0] == 20 - written  # only the parts not written
    np.testing.assert_array_equal(resumed.kept, _kept(source, filter_fns.high))


def test_a_selection_mixes_with_another_source(tmp_path):
    selection = meshfeed.select(filter_fns.source(), filter_fns.high, workers=0, cache_dir=tmp_path)
    other = meshfeed.ArraySource(
        {"id": np.arange(10_000, 10_200), "score": np.zeros(200, np.float32),
         "row": np.zeros((200, 8), np.int64)}
    )  # fmt: skip
    mixture = meshfeed.mix([selection, other], weights=[0.5, 0.5], seed=1)
    ids = np.concatenate([np.asarray(b["id"]) for b in _loader(mixture, last_batch="drop")])
    ours = ids[ids < 10_000]
    assert len(ours) and len(ids[ids >= 10_000])
    assert set(ours.tolist()) <= set(selection.kept.tolist())


def test_select_says_what_is_wrong_with_its_arguments(tmp_path):
    with pytest.raises(TypeError, match=r"not a meshfeed\.Source"):
        meshfeed.select([1, 2, 3], filter_fns.high)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="keep=3 must be a function"):
        meshfeed.select(filter_fns.source(), 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="workers=-1 must be an int >= 0"):
        meshfeed.select(filter_fns.source(), filter_fns.high, workers=-1)
    with pytest.raises(ValueError, match="executor='spark' is unknown"):
        meshfeed.select(filter_fns.source(), filter_fns.high, executor="spark")  # type: ignore[arg-type]


def test_the_cache_folder_defaults_to_the_environment_then_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("MESHFEED_CACHE_DIR", str(tmp_path / "env"))
    assert select_module.cache_root(None) == str(tmp_path / "env")
    monkeypatch.delenv("MESHFEED_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert select_module.cache_root(None) == os.path.join(str(tmp_path / "xdg"), "meshfeed")
    assert select_module.cache_root(tmp_path / "given") == str(tmp_path / "given")


# -- None from a record transform: dropped on the fly, masked -------------------------


@pytest.mark.parametrize(("workers", "kind"), [(2, "processes"), (2, "threads")])
def test_a_record_transform_returning_none_drops_the_same_rows_anywhere(workers, kind):
    def run(workers, kind):
        loader = _loader(filter_fns.source(100), record_transform=filter_fns.drop_thirds,
                         num_workers=workers, worker_type=kind)  # fmt: skip
        try:
            batches = [{k: np.asarray(v) for k, v in b.items()} for b in loader]
            return batches, loader
        finally:
            loader.close()

    want, here = run(0, "processes")
    got, there = run(workers, kind)
    dropped = 0
    for step, (w, g) in enumerate(zip(want, got, strict=True)):
        for name in w:
            np.testing.assert_array_equal(w[name], g[name])
        ids = here.ids(step)
        gone = (ids >= 0) & (ids % 3 == 0)
        np.testing.assert_array_equal(g["mask"], (ids >= 0) & ~gone)
        assert not g["row"][~g["mask"]].any()  # dropped and padded rows are zeros
        dropped += int(gone.sum())
    assert dropped == 34 and here.filtered == there.filtered == dropped  # ids 0, 3, .., 99
    assert there.stats()["record_transform"]["filtered"] == dropped
    assert not there.skipped and there.state()["skipped"] == 0  # not errors


def test_dropping_every_row_of_the_first_steps_learns_the_fields_further_on():
    loader = _loader(filter_fns.source(100), record_transform=filter_fns.drop_below,
                     shuffle=False)  # fmt: skip
    batches = list(loader)
    assert not any(np.asarray(b["mask"]).any() for b in batches[:2])  # ids 0..31: dropped
    ids = np.concatenate([np.asarray(b["id"])[np.asarray(b["mask"])] for b in batches])
    assert ids.tolist() == list(range(40, 100))


def test_a_record_transform_that_drops_everything_says_so():
    loader = _loader(filter_fns.source(100), record_transform=filter_fns.drop_all)
    with pytest.raises(ValueError, match="returned None for every one of the source's 100"):
        next(iter(loader))


def test_fit_logs_the_examples_dropped():
    loader = _loader(filter_fns.source(96), record_transform=filter_fns.drop_thirds,
                     last_batch="drop")  # fmt: skip
    mesh = meshfeed.make_mesh(data=8)

    def loss(params, batch):
        x = batch["row"].astype(np.float32).mean(-1) * params["w"]
        return meshfeed.masked_mean(x**2, batch), {}

    optimizer = optax.sgd(0.1)
    state = meshfeed.TrainState.create({"w": np.ones((), np.float32)}, optimizer, mesh=mesh)
    step = meshfeed.make_train_step(loss, optimizer, mesh=mesh)
    history = meshfeed.fit(step, state, loader, log_every=3, progress=False)
    assert history.train[-1]["filtered"] == loader.filtered == 32  # of 96: ids 0, 3, .., 93
    jax.block_until_ready(history.state)
