"""on_error="skip": a bad record becomes a masked row, and nothing else moves."""

from __future__ import annotations

import io
import json
import os

import bad_record_fns as fns
import numpy as np
import pytest

import meshfeed
from meshfeed.testing import assert_resumes_identically, run_in_processes
from multiprocess_fns import assemble

BAD = [i for i in range(fns.N) if fns.bad(i)]


def _epoch(feed: meshfeed.Loader) -> list[dict[str, np.ndarray]]:
    return [{k: np.asarray(v) for k, v in batch.items()} for batch in feed]


def test_bad_records_are_masked_rows_and_every_good_one_comes_once():
    feed = fns.loader(num_epochs=2)
    batches = _epoch(feed)
    steps = feed.steps_per_epoch
    assert steps is not None and len(batches) == 2 * steps
    for epoch in range(2):
        seen = []
        for k in range(epoch * steps, (epoch + 1) * steps):
            batch = batches[k]
            assert batch["image"].shape == (fns.BATCH, 8, 8)  # the shape is kept
            ids = feed.ids(k)  # the schedule did not move
            np.testing.assert_array_equal(batch["mask"], ~np.isin(ids, BAD))
            assert not batch["image"][~batch["mask"]].any()  # skipped rows are zero rows
            np.testing.assert_array_equal(batch["label"][batch["mask"]], ids[batch["mask"]])
            seen += batch["label"][batch["mask"]].tolist()
        in_epoch = {int(i) for k in range(epoch * steps, (epoch + 1) * steps) for i in feed.ids(k)}
        assert sorted(seen) == sorted(in_epoch - set(BAD))  # every good record, once
    # loader.skipped names each one, at its step, with the first line of its error.
    want = [
        (k, int(i), f"ValueError: cannot decode example {int(i)}: truncated data")
        for k in range(2 * steps)
        for i in feed.ids(k)
        if fns.bad(int(i))
    ]
    assert [tuple(s) for s in feed.skipped] == want
    assert feed.skipped[0].step == want[0][0] and feed.skipped[0].example == want[0][1]
    state = feed.state()
    assert state["skipped"] == len(want) and json.loads(json.dumps(state)) == state


@pytest.mark.parametrize(
    ("workers", "kind"), [(2, "processes"), (2, "threads")], ids=["2 processes", "2 threads"]
)
def test_the_same_bytes_and_skips_with_any_workers(workers, kind):
    reference = fns.stream(num_workers=0, last_batch="pad")
    assert reference[1] and reference[2] == len(reference[1])
    assert fns.stream(num_workers=workers, worker_type=kind, last_batch="pad") == reference


def test_a_batch_form_skips_the_records_the_record_form_skips_with_any_workers():
    # Its batch raises for a whole chunk; the records alone say which to skip: the same
    # rows, bytes and skips as decode's, one record at a time, for any chunks (a step, or
    # a quarter of one). Worker processes run the same code: test_vision holds them.
    reference = fns.stream(num_workers=0, last_batch="pad")
    for workers, kind in ((0, "processes"), (2, "threads")):
        got = fns.stream(
            fn=fns.DecodesInChunks(), num_workers=workers, worker_type=kind, last_batch="pad"
        )
        assert got == reference, (workers, kind)


def test_a_state_taken_mid_epoch_restores_the_same_batches():
    steps = assert_resumes_identically(lambda: fns.loader(num_workers=2), max_steps=4)
    assert steps == 4
    feed = fns.loader()
    for _, _ in zip(feed, range(5), strict=False):
        pass
    state = feed.state()
    again = fns.loader()
    again.restore(state)
    assert again.state()["skipped"] == state["skipped"] > 0  # the count goes on
    assert next(iter(again))["mask"].shape == (fns.BATCH,)


def test_max_skipped_exceeded_names_the_budget_the_count_and_the_first_ids():
    feed = fns.loader(fns.fails_often, max_skipped=5)
    with pytest.raises(
        RuntimeError,
        match=r"on_error='skip' skipped \d+ of the 32 examples this process read, more than "
        r"max_skipped=5 allows \(5 examples\)\. The first: example \d+ at step 0 \(KeyError: "
        r"'no such field'\);.*Fix the data or the record_transform, or raise max_skipped\.",
    ):
        next(iter(feed))
    as_fraction = fns.loader(fns.fails_often, max_skipped=0.5)
    assert len(_epoch(as_fraction)) == 12  # a third, under half: within the budget
    with pytest.raises(RuntimeError, match=r"more than max_skipped=0\.01 allows \(0\.01 of"):
        _epoch(fns.loader(fns.fails_often))  # the default: 1%, at least 100


def test_a_read_that_fails_skips_only_its_bad_examples():
    source = fns.BadReads(fns.source())
    feed = fns.loader(None, source_=source, prefetch=0)
    batches = _epoch(feed)
    bad_steps = 0
    for k, batch in enumerate(batches):
        ids = feed.ids(k)
        np.testing.assert_array_equal(batch["mask"], ~np.isin(ids, BAD))
        np.testing.assert_array_equal(batch["label"][batch["mask"]], ids[batch["mask"]])
        bad_steps += bool(np.isin(ids, BAD).any())
    assert sorted(s.example for s in feed.skipped) == [i for i in BAD if i < 384]
    assert {s.error.split(" does")[0] for s in feed.skipped} == {
        f"ValueError: record {s.example}" for s in feed.skipped
    }
    # A batch with one bad example is read by halves: 1 + 2 log2(32) reads, not 32.
    assert source.reads <= len(batches) + bad_steps * 2 * 5 + bad_steps


def test_a_storage_error_is_never_skipped(tmp_path):
    class Gone(fns.BadReads):
        def __getitem__(self, ids):
            raise OSError("reading s3://data/x failed for 60 s: the store is unreachable")

    with pytest.raises(OSError, match="the store is unreachable"):
        next(iter(fns.loader(None, source_=Gone(fns.source()))))


def test_a_malformed_json_line_is_skipped(tmp_path):
    path = tmp_path / "lines.jsonl"
    lines = [json.dumps({"x": i}) for i in range(64)]
    lines[10] = '{"x": 10, oops'
    path.write_text("\n".join(lines) + "\n")
    meshfeed.index([str(path)], progress=False)
    source = meshfeed.sources.JsonlSource(str(path), fields={"x": "int64"})
    feed = fns.loader(None, source_=source, shuffle=False)
    batches = _epoch(feed)
    xs = np.concatenate([b["x"][b["mask"]] for b in batches])
    assert sorted(xs.tolist()) == [i for i in range(64) if i != 10]
    assert [s.example for s in feed.skipped] == [10]
    assert feed.skipped[0].error.startswith("JsonlError: ") and "not JSON" in feed.skipped[0].error


@pytest.mark.multiprocess
def test_two_processes_mask_the_rows_one_process_masks():
    got = run_in_processes(_two, num_processes=2, devices_per_process=4)
    want = assemble([{"batches": _local()}])
    two = assemble([{"batches": r} for r in got])
    assert len(two) == len(want)
    for g, w in zip(two, want, strict=True):
        for name in w:
            np.testing.assert_array_equal(g[name], w[name])


def _local():
    from meshfeed.testing import local_shards

    feed = fns.loader(num_workers=2, last_batch="pad")
    try:
        return [{k: (v.shape, local_shards(v)) for k, v in b.items()} for b in feed]
    finally:
        feed.close()


def _two():
    return _local()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"on_error": "ignore"},
            "on_error='ignore' is unknown; pass 'raise' (a bad record ends the run) or 'skip' "
            "(it becomes a masked row, within max_skipped).",
        ),
        (
            {"on_error": "skip", "max_skipped": 1.5},
            "max_skipped=1.5 must be a count (an int >= 0) or a fraction of the examples read "
            "(a float between 0 and 1, e.g. 0.01).",
        ),
        (
            {"on_error": "skip", "max_skipped": True},
            "max_skipped=True must be a count (an int >= 0) or a fraction of the examples read "
            "(a float between 0 and 1, e.g. 0.01).",
        ),
        (
            {"on_error": "raise", "max_skipped": 10},
            "max_skipped=10 bounds the examples on_error='skip' skips, but on_error='raise'; "
            "pass on_error='skip' too, or drop max_skipped.",
        ),
    ],
)
def test_bad_on_error_arguments_are_named(kwargs, message):
    mesh = meshfeed.make_mesh(data=8)
    with pytest.raises(ValueError) as caught:
        meshfeed.Loader(
            fns.source(), global_batch_size=8, sharding=meshfeed.batch_sharding(mesh), **kwargs
        )
    assert str(caught.value) == message


def test_fit_logs_the_examples_skipped(capsys):
    import jax.numpy as jnp

    def step(state, batch):
        return state, {"loss": jnp.sum(batch["image"]) * 0}

    feed = fns.loader()
    history = meshfeed.fit(step, jnp.zeros(()), feed, log_every=4)
    assert feed.steps_per_epoch == 12 and history.steps == 12
    skipped = [row.get("skipped", 0.0) for row in history.train]
    assert skipped[-1] == len(feed.skipped) == 4  # every bad example of the epoch
    assert skipped == sorted(skipped) and skipped[0] < 4
    assert "skipped 4" in capsys.readouterr().out  # off a terminal: a line per log


def test_a_tar_member_cut_short_is_skipped(tmp_path):
    import tarfile

    path = tmp_path / "shard.tar"
    with tarfile.open(path, "w") as archive:
        for i in range(64):
            data = str(i).encode().ljust(2000)  # a member of 2000 bytes: "12", then spaces
            info = tarfile.TarInfo(f"{i:05d}.id")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    source = meshfeed.sources.TarSource(str(path), decode={"id": "int"}, key=None, build=True)
    os.truncate(path, 3 * path.stat().st_size // 4)  # cut short while in use
    broken = []
    for i in range(64):
        try:
            source[np.array([i])]
        except OSError:
            broken.append(i)
    assert 0 < len(broken) < 32
    feed = fns.loader(None, source_=source, shuffle=False)
    batches = _epoch(feed)
    ids = np.concatenate([b["id"][b["mask"]] for b in batches])
    assert sorted(ids.tolist()) == [i for i in range(64) if i not in broken]
    assert [s.example for s in feed.skipped] == broken
    first = feed.skipped[0].error
    assert first.startswith("TruncatedError: ") and "ended early" in first
