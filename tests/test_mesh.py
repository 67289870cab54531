import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import meshfeed
from meshfeed.core._mesh import device_rows, process_rows


def test_make_mesh_keeps_axis_order_and_defaults_to_auto():
    mesh = meshfeed.make_mesh(data=4, model=2)
    assert mesh.axis_names == ("data", "model")
    assert dict(mesh.shape) == {"data": 4, "model": 2}
    assert all(t == AxisType.Auto for t in mesh.axis_types)
    explicit = meshfeed.make_mesh(model=2, data=-1, axis_types="explicit")
    assert explicit.axis_names == ("model", "data") and explicit.shape["data"] == 4
    assert all(t == AxisType.Explicit for t in explicit.axis_types)


def test_make_mesh_takes_a_device_order():
    devices = jax.devices()[::-1]
    mesh = meshfeed.make_mesh(data=8, devices=devices)
    assert list(mesh.devices.flat) == devices


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"data": 3}, "hold 3 devices but there are 8"),
        ({"data": -1, "model": -1}, "only one mesh axis may be -1"),
        ({"data": 0}, "must be a positive int"),
        ({"data": 8, "axis_types": "manual"}, "axis_types='manual'"),
        ({}, "at least one axis"),
    ],
)
def test_make_mesh_rejects_bad_sizes(kwargs, match):
    with pytest.raises(ValueError, match=match):
        meshfeed.make_mesh(**kwargs)


def test_batch_sharding():
    mesh = meshfeed.make_mesh(data=4, model=2)
    assert meshfeed.batch_sharding(mesh).spec == P("data")
    assert meshfeed.batch_sharding(mesh, ("data", "model")).spec == P(("data", "model"))


def test_batch_sharding_rejects_an_axis_the_mesh_lacks():
    mesh = meshfeed.make_mesh(data=8)
    with pytest.raises(ValueError, match=r"names \['model'\], not an axis of the mesh"):
        meshfeed.batch_sharding(mesh, ("data", "model"))


def test_rows_follow_the_batch_axes_and_deduplicate_replicas():
    mesh = meshfeed.make_mesh(data=2, model=4)
    s = NamedSharding(mesh, P("data", "model"))
    rows = device_rows(s, 8)
    assert {(r.start, r.stop) for r in rows.values()} == {(0, 4), (4, 8)}
    np.testing.assert_array_equal(process_rows(s, 8), np.arange(8))
