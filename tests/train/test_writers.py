"""fit writes its figures to the writers users have: tensorboardX, CLU, W&B by duck
typing; on several processes, process 0 writes every process's input wait."""

from __future__ import annotations

import threading

import pytest
import writer_fns

from meshfeed.testing import run_in_processes

LOG_STEPS = [4, 8, 12]


def test_a_tensorboardx_writer_gets_event_files_tensorboard_reads_back(tmp_path):
    tensorboardx = pytest.importorskip("tensorboardX", reason="a test dependency (dev extra)")
    accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator",
        reason="a test dependency (dev extra)",
    )
    writer = tensorboardx.SummaryWriter(logdir=str(tmp_path))
    history = writer_fns.fit(writer, evaluate=True)
    writer.close()
    events = accumulator.EventAccumulator(str(tmp_path))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for tag in ("train/loss", "train/accuracy", "input/wait_share", "input/records_per_s",
                "input/prefetch_depth", "input/source_ms_per_step", "input/place_ms_per_step",
                "input/read_ahead_fill", "eval/accuracy"):  # fmt: skip
        assert tag in tags, tags
    placing = [e.value for e in events.Scalars("input/place_ms_per_step")]
    assert len(placing) == len(LOG_STEPS) and all(ms > 0 for ms in placing)  # loader.stats
    loss = events.Scalars("train/loss")
    assert [e.step for e in loss] == LOG_STEPS
    want = [row["loss"] for row in history.train]
    assert [e.value for e in loss] == pytest.approx(want, rel=1e-6)
    waits = [e.value for e in events.Scalars("input/wait_share")]
    assert waits == pytest.approx([row["input_wait_share"] for row in history.train], rel=1e-6)


@pytest.mark.parametrize("kind", [writer_fns.CluLike, writer_fns.WandbLike])
def test_clu_and_wandb_style_writers_get_the_loss_and_the_wait_each_log_step(kind):
    writer = kind()
    history = writer_fns.fit(writer)
    assert [step for step, _ in writer.calls] == LOG_STEPS
    for (_, scalars), row in zip(writer.calls, history.train, strict=True):
        assert scalars["train/loss"] == pytest.approx(row["loss"])
        assert scalars["input/wait_share"] == pytest.approx(row["input_wait_share"])
        assert scalars["input/records_per_s"] > 0
        assert "input/wait_share_max" not in scalars  # one process: no gathering


def test_an_object_that_writes_nothing_is_refused_with_the_three_kinds():
    with pytest.raises(TypeError, match=r"has none of write_scalars\(step, scalars\)"):
        writer_fns.fit(object())


@pytest.mark.multiprocess
def test_process_0_writes_every_processes_wait_and_process_1_nothing():
    first, second = run_in_processes(
        writer_fns.fit_on_each_process, num_processes=2, devices_per_process=4
    )
    assert second == []
    assert [step for step, _ in first] == LOG_STEPS
    for _, scalars in first:
        low, middle, high = (scalars[f"input/wait_share_{k}"] for k in ("min", "median", "max"))
        assert 0 <= low <= middle <= high <= 1
        assert scalars["input/slowest_process"] in (0.0, 1.0)
        assert "train/loss" in scalars


def test_the_log_line_names_the_slowest_process_only_when_it_waits_clearly_more():
    from meshfeed.train._writers import slowest_text

    def waits(*shares: float) -> dict[str, float]:
        ordered = sorted(shares)
        return {
            "input_wait_min": ordered[0],
            "input_wait_median": ordered[len(ordered) // 2],
            "input_wait_max": ordered[-1],
            "slowest_process": float(shares.index(ordered[-1])),
        }

    assert slowest_text(waits(0.003, 0.002, 0.041, 0.003, 0.002)) == " (max 4.1% on process 2)"
    assert slowest_text(waits(0.003, 0.004, 0.005)) == ""  # within half a point
    assert slowest_text(waits(0.30, 0.31, 0.36)) == ""  # not half again the median
    assert slowest_text({}) == ""


def test_a_fit_that_raises_writes_what_it_had_and_ends_the_writers_thread():
    writer = writer_fns.CluLike()
    with pytest.raises(RuntimeError, match="the input broke"):
        writer_fns.fit(writer, log_every=2, fail_at=6)
    assert [step for step, _ in writer.calls] == [2, 4]  # handed over before, all written
    assert not [t for t in threading.enumerate() if t.name == "meshfeed-writer"]
