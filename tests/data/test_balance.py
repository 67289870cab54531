"""Balanced steps: rows of even cost a step, dealt to the devices by cost; the rows of an
unbalanced plan, each once an epoch; a state restored under another data-parallel size."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import meshfeed
from meshfeed.testing import assert_resumes_identically

SEQ_LEN = 512


def _documents(count: int = 2500, seed: int = 0) -> meshfeed.ArraySource:
    """Long-tail lengths: log-uniform 8 .. 2·SEQ_LEN, some split across rows."""
    rng = np.random.default_rng(seed)
    lengths = np.exp(rng.uniform(np.log(8), np.log(2 * SEQ_LEN), count)).astype(int)
    tokens = [rng.integers(1, 30_000, n, dtype=np.int32) for n in lengths]
    return meshfeed.ArraySource({"tokens": meshfeed.Ragged.from_list(tokens)})


def _pairs(segment_ids: np.ndarray) -> np.ndarray:
    """Each row's attention pairs, Σ L(L+1)/2 over its documents, from its segment ids."""
    out = np.zeros(len(segment_ids))
    for r, ids in enumerate(segment_ids):
        lengths = np.bincount(ids[ids > 0])[1:]
        out[r] = (lengths * (lengths + 1) / 2).sum()
    return out


def _loader(packed, devices: int, **kw) -> meshfeed.Loader:
    mesh = meshfeed.make_mesh(data=devices, devices=jax.devices()[:devices])
    return meshfeed.Loader(
        packed, global_batch_size=packed.step_rows, sharding=meshfeed.batch_sharding(mesh),
        seed=3, **kw,
    )  # fmt: skip


def _rows(batch) -> list[bytes]:
    return [row.tobytes() for row in np.asarray(batch["tokens"])]


def test_every_device_costs_about_the_same_and_the_epoch_holds_the_plans_rows():
    docs = _documents()
    packed = meshfeed.pack(docs, SEQ_LEN, balance="pairs", step_rows=8)
    plain = meshfeed.pack(docs, SEQ_LEN)
    assert len(packed) % 8 == 0 and len(packed) - len(plain) < 8  # empty rows: whole steps
    loader = _loader(packed, 8)
    assert loader.steps_per_epoch == len(packed) // 8
    seen: list[bytes] = []
    imbalances, random_imbalances = [], []
    rng = np.random.default_rng(0)
    plain_costs = _pairs(plain[np.arange(len(plain))]["segment_ids"])
    for batch in loader:
        costs = _pairs(np.asarray(batch["segment_ids"]))  # one row a device
        if costs.min() > 0:  # a step of the empty rows aside: its idle devices are padding
            imbalances.append(costs.max() / costs.mean())
        draw = plain_costs[rng.choice(len(plain), 8, replace=False)]
        random_imbalances.append(draw.max() / draw.mean())
        seen += _rows(batch)
    assert np.mean(imbalances) <= 1.03, np.mean(imbalances)  # random steps: ~1.4
    assert np.mean(random_imbalances) > 1.3
    stats = loader.stats()["balance"]
    assert stats["devices"] == 8 and stats["steps"] >= loader.steps_per_epoch
    # The rows are the unbalanced plan's, each once, and the empty rows that make the
    # last step whole.
    plain_rows = _rows(plain[np.arange(len(plain))])
    empty = np.zeros(SEQ_LEN, np.int32).tobytes()
    assert sorted(r for r in seen if r != empty) == sorted(plain_rows)
    assert seen.count(empty) == len(packed) - len(plain)


def test_a_state_from_eight_devices_gives_each_later_step_the_same_rows_on_four_and_two():
    packed = meshfeed.pack(_documents(800), SEQ_LEN, balance="pairs", step_rows=8)
    reference = _loader(packed, 8)
    it = iter(reference)
    for _ in range(3):
        next(it)
    state = reference.state()
    later = [sorted(_rows(next(it))) for _ in range(4)]
    for devices in (4, 2):
        resumed = _loader(packed, devices)
        resumed.restore(state)
        got = [batch for _, batch in zip(range(4), resumed, strict=False)]
        assert [sorted(_rows(b)) for b in got] == later, devices
        for batch in got:  # each device's share costs about the same as the others'
            costs = _pairs(np.asarray(batch["segment_ids"]))
            if costs.min() > 0:  # a step holding empty rows (padding) aside
                loads = costs.reshape(devices, -1).sum(axis=1)
                assert loads.max() / loads.mean() < 1.03
    assert assert_resumes_identically(lambda: _loader(packed, 4), max_steps=5) == 5


def test_the_kept_order_is_the_same_bytes_from_any_build_and_the_order_in_memory(tmp_path):
    folder = tmp_path / "docs"
    docs = _documents(600)
    meshfeed.write_source(folder, {"tokens": docs[np.arange(len(docs))]["tokens"]})
    kept = meshfeed.pack(meshfeed.open_source(folder), SEQ_LEN, balance="pairs", step_rows=4)
    memory = meshfeed.pack(
        meshfeed.open_source(folder), SEQ_LEN, balance="pairs", step_rows=4, plan_dir=False
    )
    every = np.arange(len(kept))
    assert len(kept) == len(memory)
    assert _rows(kept[every]) == _rows(memory[every])
    orders = sorted((folder / "meshfeed.pack").glob("*/balance-*"))
    assert len(orders) == 1
    built = {p.relative_to(orders[0]): p.read_bytes() for p in orders[0].rglob("*") if p.is_file()}
    again = meshfeed.pack(  # the plan rebuilt on 2 workers, the order made again
        meshfeed.open_source(folder), SEQ_LEN, balance="pairs", step_rows=4,
        rebuild_plan=True, plan_workers=2,
    )  # fmt: skip
    rebuilt = {
        p.relative_to(orders[0]): p.read_bytes() for p in orders[0].rglob("*") if p.is_file()
    }
    assert rebuilt == built
    assert _rows(again[every]) == _rows(kept[every])
    # Each row's cost is kept with the order: dealing a step reads G numbers.
    assert np.array_equal(kept.row_costs(every), memory.row_costs(every))
    plain = meshfeed.pack(memory.source, SEQ_LEN, plan_dir=False)
    assert set(kept.stats()) - set(plain.stats()) == {"balance_seconds"}  # how long it took


def test_static_and_a_cost_function_and_a_token_cost(capsys):
    docs = _documents(400)
    capsys.readouterr()
    static = meshfeed.pack(docs, SEQ_LEN, balance="static", step_rows=4)
    assert "balance='static': every row costs a full one" in capsys.readouterr().err
    assert np.ptp(static.row_costs(np.arange(len(static)))) == 0
    longest = meshfeed.pack(docs, SEQ_LEN, balance=lambda lengths: float(lengths.max()),
                            step_rows=4, token_cost=2.0)  # fmt: skip
    costs = longest.row_costs(np.arange(len(longest)))
    assert np.all(np.diff(costs) >= 0)  # served by cost, cheapest first
    row = longest[np.array([len(longest) - 1])]["segment_ids"][0]
    lengths = np.bincount(row[row > 0])[1:]
    assert costs[-1] == lengths.max() + 2.0 * lengths.sum()


def test_bad_balance_settings_are_refused_with_the_fix():
    docs, mesh = _documents(200), meshfeed.make_mesh(data=8)
    with pytest.raises(ValueError, match=r"balance='flops' is not a cost model; pass 'pairs'"):
        meshfeed.pack(docs, SEQ_LEN, balance="flops", step_rows=8)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"balance= serves the rows in steps .* pass step_rows="):
        meshfeed.pack(docs, SEQ_LEN, balance="pairs")
    with pytest.raises(ValueError, match=r"step_rows=8 groups rows into steps .* pass balance="):
        meshfeed.pack(docs, SEQ_LEN, step_rows=8)
    with pytest.raises(ValueError, match=r"token_cost=-1 must be finite and >= 0"):
        meshfeed.pack(docs, SEQ_LEN, balance="pairs", step_rows=8, token_cost=-1)
    packed = meshfeed.pack(docs, SEQ_LEN, balance="pairs", step_rows=8)
    with pytest.raises(ValueError, match=r"global_batch_size=16, but .* pass global_batch_size=8"):
        meshfeed.Loader(packed, global_batch_size=16, sharding=meshfeed.batch_sharding(mesh))
    with pytest.raises(ValueError, match=r"drop shuffle_block and shuffle_window"):
        meshfeed.Loader(packed, global_batch_size=8, sharding=meshfeed.batch_sharding(mesh),
                        shuffle_block=64)  # fmt: skip


def test_balanced_steps_under_a_context_layout_deal_rows_over_the_data_axis():
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    packed = meshfeed.pack(_documents(1200), SEQ_LEN, balance="pairs", step_rows=4)
    laid_out = meshfeed.sources.context_layout(packed, cp=4)
    mesh = meshfeed.make_mesh(data=2, context=4)
    loader = meshfeed.Loader(laid_out, global_batch_size=4, seed=3,
                             sharding=NamedSharding(mesh, P("data", "context")))  # fmt: skip
    for _, batch in zip(range(20), loader, strict=False):
        costs = _pairs(np.asarray(batch["segment_ids"]))
        if costs.min() > 0:  # a step holding empty rows (padding) aside
            loads = costs.reshape(2, 2).sum(axis=1)
            assert loads.max() / loads.mean() < 1.03
    assert loader.stats()["balance"]["devices"] == 2  # the data axis, not the context one


def test_plot_packing_draws_each_steps_imbalance_beside_its_padding(tmp_path):
    import matplotlib.image

    packed = meshfeed.pack(_documents(600), SEQ_LEN, balance="pairs", step_rows=8)
    path = meshfeed.inspect.plot_packing(packed, tmp_path / "steps.png", rows=4, dpi=50)
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 150 and image[..., :3].std() > 0.05


def test_step_balance_says_what_each_step_asks_of_each_device():
    packed = meshfeed.pack(_documents(800), SEQ_LEN, balance="pairs", step_rows=8)
    figures = meshfeed.inspect.step_balance(packed, 4)
    steps = len(packed) // 8
    assert figures.loads.shape == (steps, 4) and figures.imbalance.shape == (steps,)
    total = packed.row_costs(np.arange(len(packed))).sum()
    np.testing.assert_allclose(figures.loads.sum(), total)
    assert figures.imbalance.mean() < 1.05 and (figures.imbalance >= 1).all()
    tokens = packed.row_tokens(np.arange(len(packed))).sum()
    np.testing.assert_allclose(1 - figures.padding.mean(), tokens / (len(packed) * SEQ_LEN))
    with pytest.raises(ValueError, match=r"devices=3 must be an int >= 1 dividing the 8 rows"):
        meshfeed.inspect.step_balance(packed, 3)
    with pytest.raises(ValueError, match=r"step_balance takes a pack balanced by cost"):
        meshfeed.inspect.step_balance(meshfeed.pack(_documents(50), SEQ_LEN), 4)
