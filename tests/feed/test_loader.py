import json

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshfeed
from layouts import LAYOUTS, check_strategy, make_arrays, make_layout
from meshfeed.testing import assert_resumes_identically


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("strategy", meshfeed.inspect.STRATEGIES)
def test_every_strategy_gives_source_rows_in_the_requested_sharding(strategy, layout):
    result = check_strategy(strategy, layout)
    assert result["steps"] == 7


@pytest.mark.parametrize("strategy", meshfeed.inspect.STRATEGIES)
def test_strategies_agree_bit_for_bit(strategy):
    arrays = make_arrays()
    shardings = make_layout("data2_model4_2d")

    def stream(s):
        loader = meshfeed.Loader(
            meshfeed.ArraySource(arrays), global_batch_size=16, sharding=shardings, strategy=s
        )
        return [
            {k: np.asarray(v) for k, v in meshfeed.reshard(b, shardings).items()} for b in loader
        ]

    for a, b in zip(stream("per_process"), stream(strategy), strict=True):
        for k in a:
            assert a[k].tobytes() == b[k].tobytes()


def _sharding():
    return meshfeed.batch_sharding(meshfeed.make_mesh(data=8))


def test_one_padded_epoch_yields_every_example_once():
    n = 103
    src = meshfeed.ArraySource({"id": np.arange(n)})
    loader = meshfeed.Loader(src, global_batch_size=16, sharding=_sharding(), last_batch="pad")
    seen = []
    for batch in loader:
        mask = np.asarray(batch["mask"])
        seen.extend(np.asarray(batch["id"])[mask].tolist())
        assert batch["id"].shape == (16,) and batch["mask"].dtype == np.bool_
    assert len(loader) == 7
    assert sorted(seen) == list(range(n))


def test_drop_misses_only_the_remainder():
    n = 103
    src = meshfeed.ArraySource({"id": np.arange(n)})
    loader = meshfeed.Loader(src, global_batch_size=16, sharding=_sharding(), num_epochs=2)
    assert len(loader) == 12
    batches = [np.asarray(b["id"]) for b in loader]
    assert "mask" not in next(
        iter(meshfeed.Loader(src, global_batch_size=16, sharding=_sharding()))
    )
    for epoch in (batches[:6], batches[6:]):
        ids = np.concatenate(epoch)
        assert len(np.unique(ids)) == len(ids) == 96  # 103 - 103 % 16
    assert not np.array_equal(batches[0], batches[6])  # a new order each epoch


def test_without_shuffle_the_stream_is_in_order():
    src = meshfeed.ArraySource({"id": np.arange(32)})
    loader = meshfeed.Loader(src, global_batch_size=16, sharding=_sharding(), shuffle=False)
    np.testing.assert_array_equal(np.concatenate([np.asarray(b["id"]) for b in loader]), range(32))


def test_transform_runs_on_loaded_rows():
    src = meshfeed.ArraySource({"x": np.arange(64, dtype=np.int32)})

    def transform(batch):
        return {"x": batch["x"] * 2, "x_float": batch["x"].astype(np.float32)[:, None]}

    loader = meshfeed.Loader(src, global_batch_size=16, sharding=_sharding(), transform=transform)
    for step, batch in enumerate(loader):
        np.testing.assert_array_equal(np.asarray(batch["x"]), loader.ids(step) * 2)
        assert batch["x_float"].shape == (16, 1) and batch["x_float"].dtype == np.float32


def test_transform_that_changes_the_row_count_is_refused():
    src = meshfeed.ArraySource({"x": np.arange(64)})
    loader = meshfeed.Loader(
        src, global_batch_size=16, sharding=_sharding(), transform=lambda b: {"x": b["x"][:3]}
    )
    with pytest.raises(ValueError, match=r"transform returned field 'x' as \(3,\) for 16 rows"):
        next(iter(loader))


@pytest.mark.parametrize("axis_types", ["auto", "explicit"])
def test_reshard_moves_to_the_target_inside_and_outside_jit(axis_types):
    shardings = make_layout("data2_model4_2d", axis_types=axis_types)
    loader = meshfeed.Loader(
        meshfeed.ArraySource(make_arrays()),
        global_batch_size=16,
        sharding=shardings,
        strategy="reshard",
        last_batch="pad",
    )
    batch = next(iter(loader))
    assert batch["tokens"].sharding.is_equivalent_to(
        NamedSharding(shardings["tokens"].mesh, P(("data", "model"))), 2
    )
    eager = meshfeed.reshard(batch, loader.sharding)
    inside = jax.jit(lambda b: meshfeed.reshard(b, shardings))(batch)
    for name in shardings:
        rank = batch[name].ndim
        assert eager[name].sharding.is_equivalent_to(shardings[name], rank)
        assert inside[name].sharding.is_equivalent_to(shardings[name], rank)
        np.testing.assert_array_equal(np.asarray(eager[name]), np.asarray(batch[name]))
    mask_target = NamedSharding(shardings["label"].mesh, P("data"))
    assert eager["mask"].sharding.is_equivalent_to(mask_target, 1)


def test_auto_records_its_choice_and_reason():
    loader = meshfeed.Loader(
        meshfeed.ArraySource(make_arrays()),
        global_batch_size=16,
        sharding=_sharding(),
        strategy="auto",
    )
    assert loader.strategy == "per_process"
    assert loader.plan.requested == "auto" and loader.plan.choice == "per_process"
    assert "one process" in loader.plan.reason
    assert loader.plan.costs["per_process"].rows_read == {0: 16}
    assert "auto -> per_process" in str(loader.plan)


@pytest.mark.parametrize("strategy", meshfeed.inspect.STRATEGIES)
def test_resume_at_every_step_gives_the_uninterrupted_stream(strategy):
    def make():
        return meshfeed.Loader(
            meshfeed.ArraySource(make_arrays(40)),
            global_batch_size=8,
            sharding=make_layout("data4_model2"),
            strategy=strategy,
            num_epochs=2,
            last_batch="pad",
        )

    assert assert_resumes_identically(make) == 10


def test_state_is_small_json_and_counts_consumed_steps():
    loader = meshfeed.Loader(
        meshfeed.ArraySource(make_arrays()), global_batch_size=16, sharding=_sharding()
    )
    it = iter(loader)
    next(it)
    next(it)
    state = loader.state()
    text = json.dumps(state)
    assert len(text) < 1000 and state["step"] == 2
    other = meshfeed.Loader(
        meshfeed.ArraySource(make_arrays()), global_batch_size=16, sharding=_sharding()
    )
    other.restore(json.loads(text))
    np.testing.assert_array_equal(
        np.asarray(next(iter(other))["label"]), np.asarray(next(it)["label"])
    )


def test_loader_holds_its_position_and_reset_starts_over():
    loader = meshfeed.Loader(
        meshfeed.ArraySource(make_arrays(32)), global_batch_size=16, sharding=_sharding()
    )
    first = list(loader)
    assert len(first) == 2
    it = iter(loader)
    next(it)
    del it  # a loop left early: the next one continues where it stopped
    assert len(list(loader)) == 1 and loader.step == 4  # then the next epoch's loop
    loader.reset()
    again = list(loader)
    assert [np.asarray(b["label"]).tolist() for b in again] == [
        np.asarray(b["label"]).tolist() for b in first
    ]


def test_endless_loader_has_no_len_but_keeps_going():
    loader = meshfeed.Loader(
        meshfeed.ArraySource(make_arrays(32)),
        global_batch_size=16,
        sharding=_sharding(),
        num_epochs=None,
    )
    with pytest.raises(TypeError, match="endless"):
        len(loader)
    it = iter(loader)
    for _ in range(5):
        next(it)
    assert loader.step == 5


# -- bad input: a clear error before any array is built ----------------------------------


def _loader(**overrides):
    kwargs = {
        "global_batch_size": 16,
        "sharding": _sharding(),
    }
    kwargs.update(overrides)
    source = kwargs.pop("source", meshfeed.ArraySource(make_arrays()))
    return meshfeed.Loader(source, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"global_batch_size": 12},
            ValueError,
            r"global_batch_size=12 is not divisible by the 8 devices on mesh axes \('data',\)"
            r".*pass a multiple of 8",
        ),
        ({"global_batch_size": 0}, ValueError, "global_batch_size=0 must be >= 1"),
        ({"global_batch_size": 16.0}, TypeError, "global_batch_size=16.0 must be an int"),
        ({"strategy": "fastest"}, ValueError, "strategy='fastest' is unknown; pass one of"),
        ({"last_batch": "keep"}, ValueError, "last_batch='keep' is unknown; pass 'drop' or 'pad'"),
        ({"seed": -1}, ValueError, "seed=-1 must be an int >= 0"),
        ({"num_epochs": 0}, ValueError, "num_epochs=0 must be an int >= 1, or None"),
        ({"source": {"x": np.zeros(3)}}, TypeError, "not a meshfeed.Source; wrap arrays"),
        (
            {"source": meshfeed.ArraySource({"x": np.zeros((0, 2))})},
            ValueError,
            "source has 0 examples",
        ),
        (
            {"source": meshfeed.ArraySource({"x": np.zeros((10, 2))})},
            ValueError,
            "exceeds the 10 examples.*last_batch='pad'",
        ),
        (
            {"sharding": P("data")},
            TypeError,
            r"sharding is a PartitionSpec .*which names no mesh; pass NamedSharding\(mesh",
        ),
        ({"sharding": {"image": _sharding()}}, ValueError, r"missing: \['tokens', 'label'\]"),
        ({"transform": 3}, TypeError, "transform=3 must be a function"),
    ],
)
def test_bad_input_is_refused_with_the_fix(kwargs, error, match):
    with pytest.raises(error, match=match):
        _loader(**kwargs)


def test_a_non_batch_dimension_that_does_not_split_is_refused():
    mesh = meshfeed.make_mesh(data=2, model=4)
    src = meshfeed.ArraySource({"tokens": np.zeros((32, 6), np.int32)})
    with pytest.raises(ValueError, match="field 'tokens' has size 6 in dimension 1"):
        meshfeed.Loader(src, global_batch_size=16, sharding=NamedSharding(mesh, P("data", "model")))


def test_a_spec_longer_than_the_field_is_refused():
    mesh = meshfeed.make_mesh(data=2, model=4)
    src = meshfeed.ArraySource({"label": np.zeros(32, np.int32)})
    with pytest.raises(ValueError, match="shorten the PartitionSpec"):
        meshfeed.Loader(src, global_batch_size=16, sharding=NamedSharding(mesh, P("data", "model")))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"source": meshfeed.ArraySource(make_arrays(99))}, "another dataset: num_examples=100"),
        ({"seed": 1}, "another seed: seed=0 in the state, 1 in this loader"),
        ({"last_batch": "pad"}, "another last_batch"),
    ],
)
def test_a_state_from_another_run_is_refused(change, match):
    state = _loader().state()
    with pytest.raises(ValueError, match=match):
        _loader(**change).restore(state)


def test_a_state_that_is_not_one_is_refused():
    with pytest.raises(ValueError, match=r"pass the dict returned by Loader\.state"):
        _loader().restore({"step": 3})
    ramp = _loader(global_batch_size=[(0, 8), (2, 16)])
    with pytest.raises(ValueError, match=r"past this loader's \d+ steps"):
        ramp.restore({**ramp.state(), "step": 100})
    loader = _loader()  # fixed steps: a state past the first pass is in a later one
    loader.restore({**loader.state(), "step": 7})
    assert len(list(loader)) == 5 and loader.step == 12


def test_arguments_are_read_only_attributes():
    loader = _loader(seed=3)
    assert loader.seed == 3 and loader.options.seed == 3 and loader.prefetch == "auto"
    with pytest.raises(AttributeError, match=r"Loader\.seed is read-only.*seed=5"):
        loader.seed = 5  # type: ignore[misc]
    with pytest.raises(AttributeError):
        loader.plan = None  # type: ignore[misc]
    assert loader.seed == 3 and loader.ids(0).tolist() == _loader(seed=3).ids(0).tolist()


def test_each_option_is_defined_once_and_the_signature_docs_and_attributes_follow():
    """One field an option (``LoaderOptions``): the signature names the same options in
    the same order with the same defaults and types, ``Loader``'s Args are the fields'
    texts, and each is a read-only attribute documented by its text."""
    import dataclasses
    import inspect

    fields = [f for f in dataclasses.fields(meshfeed.types.LoaderOptions) if f.init]
    parameters = list(inspect.signature(meshfeed.Loader).parameters.values())
    assert [p.name for p in parameters] == ["source", *(f.name for f in fields)]
    for parameter, field in zip(parameters[1:], fields, strict=True):
        default = field.default
        assert parameter.default == (
            inspect.Parameter.empty if default is dataclasses.MISSING else default
        ), field.name
        assert parameter.annotation == field.type, field.name
        assert parameter.kind == inspect.Parameter.KEYWORD_ONLY
    doc = meshfeed.Loader.__doc__ or ""
    for field in fields:
        assert f"\n      {field.name}: {field.metadata['doc'].split()[0]}" in doc, field.name
        if field.name != "strategy":  # the loader's own: the strategy in use
            assert getattr(meshfeed.Loader, field.name).__doc__.endswith(field.metadata["doc"])
    assert "The options, by group: what a step holds" in doc
