"""Schedules: mixture weights by stage, every pass reshuffled, a batch size that ramps,
states restored anywhere, and schedules changed after the restored step."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import schedule_fns

import meshfeed
import train_fns
from meshfeed.testing import assert_resumes_identically, run_in_processes


def _sources_of(loader: meshfeed.Loader, step: int) -> np.ndarray:
    """The source of each row of ``step`` (through the mixture's own map)."""
    ids = loader.ids(step)
    return loader.source.locate(ids[ids >= 0])[0]  # type: ignore[attr-defined]


def _big_mix_loader(weights, length: int, batch: int = 64) -> meshfeed.Loader:
    sources = [schedule_fns.tagged(t, n) for t, n in enumerate((5000, 3000, 2000))]
    return meshfeed.Loader(
        meshfeed.mix(sources, weights, length=length),
        global_batch_size=batch,
        sharding=meshfeed.batch_sharding(meshfeed.make_mesh(data=8)),
        shuffle=False,
    )


def test_weights_by_stage_hold_in_each_stage_and_in_every_batch():
    stages = [(0, [0.7, 0.2, 0.1]), (200, [0.2, 0.3, 0.5]), (400, [0.5, 0.5, 0.0])]
    loader = _big_mix_loader(stages, length=600 * 64)
    assert len(loader) == 600
    for (first, weights), last in zip(stages, (200, 400, 600), strict=True):
        per_step = np.stack(
            [np.bincount(_sources_of(loader, k), minlength=3) for k in range(first, last)]
        )
        shares = per_step.sum(0) / per_step.sum()
        np.testing.assert_allclose(shares, weights, atol=0.01)  # the fixed mix's tolerance
        # Each batch is a well-mixed draw: within two rows of its expected count.
        assert np.abs(per_step - 64 * np.asarray(weights)).max() <= 2
        assert loader.stage(first).mix_stage == stages.index((first, weights))


def test_a_blend_moves_the_shares_step_by_step():
    loader = _big_mix_loader([(0, [0.9, 0.1, 0.0]), (10, [0.1, 0.5, 0.4], 20)], 40 * 40, 40)
    target = []
    counts = []
    for k in range(10, 30):
        t = k - 10
        target.append(40 * (np.array([0.9, 0.1, 0.0]) + np.array([-0.8, 0.4, 0.4]) * (t + 1) / 21))
        counts.append(np.bincount(_sources_of(loader, k), minlength=3))
        assert loader.stage(k).blending
        np.testing.assert_allclose(np.array(loader.stage(k).weights), target[-1] / 40, atol=1e-6)
    assert np.abs(np.array(counts) - np.array(target)).max() < 2
    # The rounding carries from step to step: every step's running total is right to
    # one example.
    running = np.cumsum(counts, 0) - np.cumsum(target, 0)
    assert np.abs(running).max() < 1
    assert not loader.stage(30).blending
    assert np.bincount(_sources_of(loader, 35), minlength=3).tolist() == [4, 20, 16]


@pytest.mark.parametrize("shuffle", [True, False])
def test_no_example_is_skipped_or_repeated_within_a_pass_across_weight_changes(shuffle):
    stages = [(0, [0.5, 0.5]), (7, [0.1, 0.9]), (13, [0.9, 0.1], 5), (25, [0.0, 1.0])]
    mixture = meshfeed.mix(
        [schedule_fns.tagged(0, 37), schedule_fns.tagged(1, 23)],
        stages,
        global_batch_size=16,
        length=40 * 16,
        shuffle=shuffle,
    )
    rows = mixture[np.arange(len(mixture))]
    for tag, n in ((0, 37), (1, 23)):
        drawn = rows["id"][rows["src"] == tag]
        passes = [drawn[i : i + n] for i in range(0, len(drawn), n)]
        assert len(passes) >= 4
        for p in passes[:-1]:
            assert sorted(p.tolist()) == list(range(n))  # every example once per pass
        assert len(set(passes[-1].tolist())) == len(passes[-1])  # the last pass so far
        in_order = [np.array_equal(p, np.arange(len(p))) for p in passes]
        if shuffle:  # each pass a new order
            assert not any(in_order)
            assert len({tuple(p.tolist()) for p in passes[:-1]}) == len(passes) - 1
        else:
            assert all(in_order)


def _ramp(**options) -> meshfeed.Loader:
    source = meshfeed.ArraySource(
        {"id": np.arange(1000, dtype=np.int32), "x": np.arange(1000, dtype=np.float32)}
    )
    return meshfeed.Loader(
        source,
        sharding=meshfeed.batch_sharding(meshfeed.make_mesh(data=8)),
        seed=5,
        **{"global_batch_size": [(0, 32), (10, 64), (20, 128)], "num_epochs": 3, **options},
    )


def test_a_ramp_reads_every_example_once_per_epoch_and_steps_straddle_epochs():
    loader = _ramp()
    assert len(loader) == 35  # 320 + 640 + 15 x 128 = 2880 of 3000 positions
    assert loader.steps_per_epoch is None
    sizes = [loader.batch_size(k) for k in range(35)]
    assert sizes == [32] * 10 + [64] * 10 + [128] * 15
    got = []
    for k, batch in enumerate(loader):
        assert batch["id"].shape == (sizes[k],)
        assert batch["id"].sharding == loader.sharding
        np.testing.assert_array_equal(np.asarray(batch["id"]), loader.ids(k))
        got.append(np.asarray(batch["id"]))
    ids = np.concatenate(got)
    assert len(ids) == 2880
    for e in range(2):
        assert sorted(ids[1000 * e : 1000 * (e + 1)].tolist()) == list(range(1000))
    assert len(set(ids[2000:].tolist())) == 880
    # Step 20 reads positions 960 to 1087: the end of epoch 0 and the start of epoch 1.
    straddling = ids[960:1088]
    assert set(straddling[:40].tolist()) | set(ids[:960].tolist()) == set(range(1000))
    # The same positions as a fixed batch size, only cut into other steps.
    fixed = _ramp(global_batch_size=8)
    np.testing.assert_array_equal(np.concatenate([fixed.ids(k) for k in range(360)]), ids)


def test_a_ramp_with_pad_ends_on_a_partial_step():
    loader = _ramp(last_batch="pad", num_epochs=1)
    assert len(loader) == 21  # 320 + 640 + 40 of a 128-row step
    last = loader.batch(20)
    mask = np.asarray(last["mask"])
    assert last["id"].shape == (128,) and mask.sum() == 40 and mask[:40].all()


def _record(record, rng):
    return {"id": record["id"], "r": np.int64(rng.integers(1 << 40))}


def test_record_transforms_key_each_row_on_its_own_epoch_when_a_step_straddles_two():
    def drawn(loader: meshfeed.Loader) -> dict[tuple[int, int], int]:
        batches = [{n: np.asarray(v) for n, v in b.items()} for b in loader]
        ids = np.concatenate([b["id"] for b in batches])
        r = np.concatenate([b["r"] for b in batches])
        return {(p // 1000, int(i)): int(v) for p, (i, v) in enumerate(zip(ids, r, strict=True))}

    ramp = _ramp(num_epochs=2, record_transform=_record, prefetch=0)
    fixed = _ramp(num_epochs=2, record_transform=_record, prefetch=0, global_batch_size=8)
    want = drawn(fixed)
    ramp_drawn = drawn(ramp)
    assert len(ramp_drawn) == 1984
    assert all(want[key] == value for key, value in ramp_drawn.items())


def test_every_size_of_a_ramp_is_checked_against_the_mesh_before_the_first_step():
    with pytest.raises(ValueError, match="global_batch_size=36"):
        _ramp(global_batch_size=[(0, 32), (5, 36)])


def test_state_restores_exactly_at_every_step_of_both_schedules():
    assert assert_resumes_identically(lambda: schedule_fns.loader(prefetch=0)) == 26


@pytest.mark.multiprocess
def test_states_mid_stage_at_a_boundary_and_mid_ramp_continue_on_one_two_and_four_processes():
    two = run_in_processes(schedule_fns.record_run, num_processes=2)
    want = schedule_fns.assemble([r["batches"] for r in two])
    assert len(want) == 26
    assert two[0]["states"] == two[1]["states"]
    # Mid-stage and mid-ramp (3), the blend's first step (6), a new batch size (8),
    # mid-blend (8 + 1), the second mix stage (10), the last batch size (16).
    picks = [3, 6, 9, 10, 16]
    states = [two[0]["states"][k - 1] for k in picks]
    one = [schedule_fns.assemble([c]) for c in schedule_fns.continue_from(states, 5)]
    four = run_in_processes(
        schedule_fns.continue_from, states, 5, num_processes=4, devices_per_process=2
    )
    for i, k in enumerate(picks):
        again = schedule_fns.assemble([per_process[i] for per_process in four])
        for got in (one[i], again):
            assert len(got) == 5
            for g, w in zip(got, want[k : k + 5], strict=True):
                np.testing.assert_array_equal(g["id"], w["id"])
                np.testing.assert_array_equal(g["src"], w["src"])


def _ids(loader: meshfeed.Loader, steps: range) -> list[list[int]]:
    """The (source, example) each row of ``steps`` reads, through the mixture."""
    mixture = loader.source
    return [np.stack(mixture.locate(loader.ids(k))).T.tolist() for k in steps]  # type: ignore[attr-defined]


def test_an_appended_stage_after_the_restored_step_is_accepted_and_a_changed_past_refused():
    old = schedule_fns.loader(prefetch=0)
    for _ in zip(range(12), old, strict=False):
        pass
    state = old.state()
    annealed = schedule_fns.loader(weights=[*schedule_fns.WEIGHTS, (20, [0.05, 0.95])])
    annealed.restore(state)
    assert annealed.step == 12
    assert _ids(annealed, range(12, 20)) == _ids(old, range(12, 20))
    assert _ids(annealed, range(20, 26)) != _ids(old, range(20, 26))
    ramped = schedule_fns.loader(sizes=[*schedule_fns.SIZES, (20, 128)])
    ramped.restore(state)
    assert len(ramped) == 23 and _ids(ramped, range(12, 20)) == _ids(old, range(12, 20))

    changed = [(0, [0.8, 0.2]), (6, [0.4, 0.6], 4), (14, [0.5, 0.5])]
    with pytest.raises(ValueError, match=r"state is at step 12, but its schedule "):
        schedule_fns.loader(weights=changed).restore(state)
    with pytest.raises(ValueError, match=r"differs from this loader's from step 6 on"):
        schedule_fns.loader(weights=changed).restore(state)
    with pytest.raises(
        ValueError, match=r"global_batch_size differs from this loader's from step 5"
    ):
        schedule_fns.loader(sizes=[(0, 16), (5, 32), (16, 64)]).restore(state)


@pytest.mark.multiprocess
def test_a_state_restores_onto_another_batch_size_reading_every_example_once():
    """A job restarted with another batch size: the state's steps of 16, then 24 (or 8)
    from the restored step, and the epoch reads every example once -- here and on 2
    processes of 2 devices; the restored loader's own state restores again."""
    first = schedule_fns.plain(16)
    taken = [np.asarray(b["id"]) for _, b in zip(range(21), first, strict=False)]
    state = first.state()
    for size in (24, 8):
        again = schedule_fns.plain(size)
        again.restore(state)
        assert again.step == 21 and again.global_batch_size == [(0, 16), (21, size)]
        assert len(again) == 21 + (schedule_fns.PLAIN - 21 * 16) // size
        ahead = again.ids(25)
        rest = [np.asarray(b["id"]) for b in again]
        assert {len(r) for r in rest} == {size}
        assert sorted(np.concatenate(taken + rest).tolist()) == list(range(schedule_fns.PLAIN))
        later = schedule_fns.plain(size)
        later.restore(_state_at(size, state, 25))
        np.testing.assert_array_equal(later.ids(25), ahead)
    with pytest.raises(ValueError, match="from another seed"):
        meshfeed.Loader(first.source, global_batch_size=24, sharding=first.sharding,
                        seed=4).restore(state)  # fmt: skip
    two = run_in_processes(schedule_fns.resumed, state, 24, num_processes=2,
                           devices_per_process=2)  # fmt: skip
    got = schedule_fns.assemble(two)
    want = schedule_fns.plain(24)
    want.restore(state)
    assert [g["id"].tolist() for g in got] == [np.asarray(b["id"]).tolist() for b in want]


def _state_at(size: int, state: dict, step: int) -> dict:
    """The state a loader restored from ``state`` onto ``size`` holds at ``step``."""
    loader = schedule_fns.plain(size)
    loader.restore(state)
    for _ in zip(range(step - loader.step), loader, strict=False):
        pass
    return loader.state()


def _ragged(tag: int, n: int) -> meshfeed.ArraySource:
    lengths = np.random.default_rng(tag).integers(1, 20, n)
    docs = [np.full(k, tag, np.int32) for k in lengths]
    return meshfeed.ArraySource({"tokens": meshfeed.Ragged.from_list(docs, dtype=np.int32)})


def test_pack_over_a_scheduled_mixture_packs_in_its_order():
    stages = [(0, [0.9, 0.1]), (25, [0.1, 0.9])]
    with pytest.raises(TypeError, match=r"mix\(\.\.\., global_batch_size=\)"):
        meshfeed.pack(meshfeed.mix([_ragged(1, 300), _ragged(2, 300)], stages), 32)
    mixture = meshfeed.mix(
        [_ragged(1, 300), _ragged(2, 300)], stages, global_batch_size=16, length=800
    )
    packed = meshfeed.pack(mixture, 32, window=64)
    assert packed.ordered and packed.stats()["documents"] == 800
    sharding = meshfeed.batch_sharding(meshfeed.make_mesh(data=8))
    with pytest.raises(ValueError, match="Pass shuffle=False"):
        meshfeed.Loader(packed, global_batch_size=8, sharding=sharding)
    loader = meshfeed.Loader(packed, global_batch_size=8, sharding=sharding, shuffle=False)
    tokens = np.concatenate([np.asarray(b["tokens"]) for b in loader])
    quarter = len(tokens) // 4
    share_of_2 = [(t[t > 0] == 2).mean() for t in (tokens[:quarter], tokens[-quarter:])]
    assert share_of_2[0] < 0.2 and share_of_2[1] > 0.8
    assert assert_resumes_identically(
        lambda: meshfeed.Loader(
            packed, global_batch_size=8, sharding=sharding, shuffle=False, prefetch=0
        ),
        max_steps=6,
    )


def test_what_a_scheduled_mixture_refuses():
    a, b = schedule_fns.tagged(0, 30), schedule_fns.tagged(1, 30)
    with pytest.raises(ValueError, match="Pass shuffle=False"):
        schedule_fns.loader(shuffle=True)
    with pytest.raises(ValueError, match="num_epochs=2: a mixture with stages is one pass"):
        schedule_fns.loader(num_epochs=2)
    staged = meshfeed.mix([a, b], [(0, [1, 1]), (4, [1, 3])], global_batch_size=16)
    with pytest.raises(ValueError, match=r"sources\[0\] changes its weights by stage"):
        meshfeed.mix([staged, a], [1, 1])
    with pytest.raises(ValueError, match="give both the same"):
        meshfeed.Loader(
            staged,
            global_batch_size=8,
            sharding=meshfeed.batch_sharding(meshfeed.make_mesh(data=8)),
            shuffle=False,
        )
    with pytest.raises(ValueError, match=r"weights\[2\] starts at step 12, inside the blend"):
        meshfeed.mix([a, b], [(0, [1, 1]), (10, [1, 3], 5), (12, [3, 1])])
    with pytest.raises(ValueError, match=r"weights\[0\] starts at step 3; the first stage"):
        meshfeed.mix([a, b], [(3, [1, 1])])
    with pytest.raises(TypeError, match="does not know how many positions a step reads"):
        len(meshfeed.mix([a, b], [(0, [1, 1]), (4, [1, 3])]))


def _counting(traced: list):
    def loss(params, batch):
        traced.append(batch["x"].shape)
        return train_fns.loss_fn(params, batch)

    return loss


@pytest.mark.parametrize("mode", ["jit", "shard_map", "pmap"])
def test_fit_compiles_once_per_batch_size_and_logs_it(mode):
    mesh = meshfeed.make_mesh(data=8)
    loader = meshfeed.Loader(
        train_fns.source(),
        global_batch_size=[(0, 8), (4, 16), (8, 32)],
        sharding=meshfeed.batch_sharding(mesh),
        num_epochs=5,
    )
    traced: list = []
    state = meshfeed.TrainState.create(train_fns.init_params(), train_fns.OPTIMIZER, mesh=mesh)
    step = meshfeed.make_train_step(_counting(traced), train_fns.OPTIMIZER, mesh=mesh, mode=mode)
    history = meshfeed.fit(step, state, loader, num_steps=14, log_every=1, progress=False)
    assert [r["batch_size"] for r in history.train] == [8] * 4 + [16] * 4 + [32] * 6
    assert len(traced) == 3 and len(set(traced)) == 3


def test_fit_logs_the_mixture_stage_and_the_plan_shows_the_spans_ahead(capsys):
    loader = schedule_fns.loader()
    text = meshfeed.show_plan(loader.plan)
    for line in (
        "steps 0-5",
        "batch 16  mix stage 0 (0.80/0.20)",
        "steps 6-7",
        "mix stage 1 (blending 0.80/0.20 -> 0.30/0.70 over steps 6-9)",
        "steps 16-25",
        "batch 64  mix stage 2 (0.50/0.50)",
    ):
        assert line in text, text
    spans = loader.plan.schedule
    assert [(s.first, s.last, s.batch_size) for s in spans] == [
        (0, 5, 16), (6, 7, 16), (8, 9, 32), (10, 13, 32), (14, 15, 32), (16, 25, 64),
    ]  # fmt: skip

    @jax.jit
    def step(state, batch):
        return state + 1, {"loss": jnp.mean(batch["src"].astype(jnp.float32))}

    history = meshfeed.fit(step, jnp.zeros(()), loader, num_steps=12, log_every=4)
    out = capsys.readouterr().out
    assert [r["mix_stage"] for r in history.train] == [0, 1, 1]
    assert [r["batch_size"] for r in history.train] == [16, 16, 32]  # steps 3, 7, 11
    assert "step 8/12" in out and "batch 16  mix stage 1 (blending" in out
    assert "batch 32  mix stage 1 (0.30/0.70)" in out
    assert loader.plan.schedule[0].first == 12  # the plan looks ahead from the position


def test_plot_mixture_draws_each_sources_share_over_the_steps(tmp_path):
    from matplotlib.image import imread

    path = meshfeed.inspect.plot_mixture(schedule_fns.loader(), tmp_path / "mix.png")
    height, width, _ = imread(path).shape
    assert width > 600 and height > 300
    with pytest.raises(TypeError, match="reads a mixture"):
        meshfeed.inspect.plot_mixture(_ramp(), tmp_path / "none.png")


def test_a_mixtures_fingerprint_includes_its_sources_own():
    sharding = meshfeed.batch_sharding(meshfeed.make_mesh(data=8))
    docs = _ragged(1, 200)

    def mixed(seed: int) -> meshfeed.Loader:
        rows = meshfeed.pack(docs, 16, seed=seed)
        return meshfeed.Loader(
            meshfeed.mix([rows, rows], [1, 1], length=64), global_batch_size=8, sharding=sharding
        )

    ours, theirs = mixed(0).state()["source"], mixed(1).state()["source"]
    assert ours["weights"] == theirs["weights"] and ours["sources"] != theirs["sources"]
    with pytest.raises(ValueError, match="the state is from another dataset: source="):
        mixed(1).restore(mixed(0).state())
