"""loader.stats(): what each stage did, as JSON, counts that match what was read; and
plot_pipeline's picture of it."""

from __future__ import annotations

import json
import threading

import bad_record_fns
import jax
import numpy as np
import pytest

import meshfeed

N, BATCH, WIDTH = 1024, 64, 16


def _source() -> meshfeed.ArraySource:
    x = np.arange(N * WIDTH, dtype=np.float32).reshape(N, WIDTH)
    return meshfeed.ArraySource({"x": x, "id": np.arange(N, dtype=np.int64)})


def _double(record, rng):
    return {"x": record["x"] * 2, "id": record["id"]}


def _loader(**kwargs) -> meshfeed.Loader:
    mesh = meshfeed.make_mesh(data=jax.device_count())
    return meshfeed.Loader(
        _source(), global_batch_size=BATCH, sharding=meshfeed.batch_sharding(mesh), **kwargs
    )


def test_stats_are_json_with_every_stage_and_count_what_was_read():
    loader = _loader(record_transform=_double, num_workers=2, worker_type="threads",
                     transform=lambda batch: batch)  # fmt: skip
    seen = sum(int(b["id"].shape[0]) for b in loader)
    loader.close()
    stats = json.loads(json.dumps(loader.stats()))  # JSON-able, all of it
    steps = N // BATCH
    assert seen == N and stats["steps"] == steps
    source = stats["source"]
    assert source["records"] == N
    assert source["bytes"] == N * (WIDTH * 4 + 8)  # float32 x and int64 id, every row once
    assert source["reads"] == steps and source["skipped"] == 0 and source["seconds"] > 0
    assert source["url"] == dict.fromkeys(
        ["requests", "retries", "hedges", "hedges_won", "bytes", "cache_hits", "cache_downloads"], 0
    )
    records = stats["record_transform"]
    assert records["records"] == N and records["skipped"] == 0
    assert (records["workers"], records["worker_type"]) == (2, "threads")
    assert records["seconds"] > 0  # the threads' time, reported by them
    assert stats["transform"]["calls"] == steps
    assert stats["place"]["steps"] == steps and stats["place"]["seconds"] > 0
    consumer = stats["consumer"]
    assert consumer["steps"] == steps and consumer["records"] == N
    assert 0 <= consumer["wait_seconds"] <= consumer["next_seconds"] <= stats["seconds"]
    assert consumer["wait_seconds"] == pytest.approx(
        consumer["wait_read_ahead_seconds"] + consumer["wait_workers_seconds"]
    )
    ahead = consumer["read_ahead"]
    assert ahead["depth"] >= 1 and 0 <= ahead["ready_share"] <= 1 and 0 <= ahead["fill"] <= 1
    assert ahead["threads"] >= 1 and ahead["moves"][0]["why"].startswith("start")
    assert ahead["moves"][-1]["depth"] == ahead["depth"]  # the depth is where it last moved
    assert stats["records_per_s"] == pytest.approx(N / stats["seconds"])
    assert 3 * steps <= stats["counter_updates"] <= 5 * steps  # per call, not per record


def test_without_transforms_those_stages_are_none_and_reset_starts_a_new_window():
    loader = _loader(num_epochs=None)
    batches = iter(loader)
    for _ in range(5):
        next(batches)
    first = loader.stats(reset=True)
    assert first["record_transform"] is None and first["transform"] is None
    assert first["steps"] == first["place"]["steps"] == 5
    for _ in range(3):
        next(batches)
    second = loader.stats()
    assert second["steps"] == 3 and second["consumer"]["steps"] == 3
    assert second["seconds"] < first["seconds"] + second["seconds"]
    assert loader.stats()["steps"] == 3  # without reset the window goes on


def test_record_workers_report_their_records_skips_and_seconds():
    loader = bad_record_fns.loader(num_workers=2)  # processes, 1% bad records
    list(loader)
    loader.close()
    stats = loader.stats()
    skipped = len(loader.skipped)
    assert skipped > 0
    records = stats["record_transform"]
    assert records["skipped"] == skipped and stats["source"]["skipped"] == 0
    assert records["records"] == stats["source"]["records"] == stats["steps"] * bad_record_fns.BATCH
    assert records["worker_type"] == "processes" and records["seconds"] > 0


def test_a_source_that_fails_on_bad_records_counts_them_as_its_own():
    source = bad_record_fns.BadReads(bad_record_fns.source())
    loader = bad_record_fns.loader(None, source_=source)
    list(loader)
    stats = loader.stats()
    assert stats["source"]["skipped"] == len(loader.skipped) > 0
    assert stats["source"]["records"] + stats["source"]["skipped"] == (
        stats["steps"] * bad_record_fns.BATCH
    )


def test_plot_pipeline_draws_a_loaders_stats_even_read_back_from_json(tmp_path):
    loader = _loader(record_transform=_double, transform=lambda batch: batch)
    list(loader)
    stats = json.loads(json.dumps(loader.stats()))
    path = meshfeed.inspect.plot_pipeline(stats, tmp_path / "pipeline.png")
    image = pytest.importorskip("matplotlib.image", reason="the plot extra").imread(path)
    assert image.shape[0] > 200 and image.shape[1] > 600
    assert image[..., :3].std() > 0.05  # something drawn, not a blank page


def test_plot_pipeline_says_what_it_needs():
    with pytest.raises(TypeError, match="stats"):
        meshfeed.inspect.plot_pipeline([1, 2], "x.png")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no step"):
        meshfeed.inspect.plot_pipeline(_loader().stats(), "x.png")
    with pytest.raises(ValueError, match=r"\.png or \.svg"):
        meshfeed.inspect.plot_pipeline(_loader().stats(), "x.jpg")


def test_counts_from_many_threads_are_exact_after_the_threads_end():
    from meshfeed.core._tally import Tally

    tally = Tally("calls", "seconds")

    def work():
        for _ in range(20_000):
            tally.add(1, 0.5)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert tally.values() == {"calls": 160_000, "seconds": 80_000.0}
    tally.add(seconds=1.0)  # by name, from this thread
    assert tally.values() == {"calls": 160_000, "seconds": 80_001.0}
    assert tally.updates == 160_001


def test_stats_count_the_files_opened_past_the_bound(tmp_path):
    """A global shuffle over more files than ``max_open_files``: stats() says how many
    were opened (again after a close) and that no more than the bound stayed open."""
    from meshfeed.storage._handles import DEFAULT_MAX_OPEN_FILES, HANDLES

    meshfeed.write_source(tmp_path / "d", {"x": np.arange(256, dtype=np.int32)}, shard_size=8)
    try:
        source = meshfeed.open_source(tmp_path / "d", max_open_files=4)  # 32 files
        mesh = meshfeed.make_mesh(data=jax.device_count())
        loader = meshfeed.Loader(source, global_batch_size=64, shuffle=True, prefetch=0,
                                 sharding=meshfeed.batch_sharding(mesh))  # fmt: skip
        seen = np.sort(np.concatenate([np.asarray(b["x"]) for b in loader]))
        files = loader.stats()["source"]["files"]
    finally:
        HANDLES.ask(DEFAULT_MAX_OPEN_FILES)
    assert (seen == np.arange(256)).all()
    assert files["max_open_files"] == 4 and files["open"] <= 4
    assert 32 < files["opened"] <= 256  # each file at least once, some again; a read at most
