from types import SimpleNamespace

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import meshfeed
import multiprocess_fns
from meshfeed.core._mesh import (
    axes_across_processes,
    device_granules,
    device_rows,
    process_rows,
)
from meshfeed.testing import run_in_processes


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


@pytest.mark.parametrize("axes", [{"data": 8}, {"data": 4, "model": 2}, {"a": 2, "b": 2, "c": 2}])
def test_make_mesh_lays_devices_out_as_jax_make_mesh_does(axes):
    want = jax.make_mesh(tuple(axes.values()), tuple(axes))
    for mesh in (meshfeed.make_mesh(**axes), meshfeed.make_mesh(**axes, dcn=next(iter(axes)))):
        assert mesh.axis_names == want.axis_names
        assert [d.id for d in mesh.devices.flat] == [d.id for d in want.devices.flat]
        assert mesh.devices.shape == want.devices.shape
        assert all(t == AxisType.Auto for t in mesh.axis_types)


@pytest.mark.multiprocess
def test_dcn_keeps_each_process_on_a_block_of_the_fast_axes():
    first, second = run_in_processes(multiprocess_fns.meshes_by_topology)
    for got in (first, second):
        data_model = got["data_model"]  # data=4, model=2: rows 0-1 on process 0
        np.testing.assert_array_equal(data_model["processes"], [[0, 0], [0, 0], [1, 1], [1, 1]])
        model_data = got["model_data"]  # model=2, data=4: columns 0-1 on process 0
        np.testing.assert_array_equal(model_data["processes"], [[0, 0, 1, 1], [0, 0, 1, 1]])
        for case in (data_model, model_data):
            assert case["across"] == ("data",)
            assert "mesh axes across processes: data\n" in case["text"]
        assert got["model_data_plain"]["across"] == ("model",)  # without dcn=, in order


def test_axes_across_processes_for_a_planned_process_count():
    assert axes_across_processes(meshfeed.make_mesh(data=4, model=2)) == ()
    assert axes_across_processes(meshfeed.make_mesh(data=4, model=2), processes=2) == ("data",)
    assert axes_across_processes(meshfeed.make_mesh(model=2, data=4), processes=2) == ("model",)
    assert axes_across_processes(meshfeed.make_mesh(a=2, b=2, c=2), processes=8) == ("a", "b", "c")


def test_granules_are_slices_when_devices_have_distinct_slice_indices():
    def device(process, slice_index=None):
        return SimpleNamespace(process_index=process, slice_index=slice_index)

    multislice = [device(p, p // 2) for p in range(4)]
    kind, groups = device_granules(multislice)
    assert kind == "slice" and groups == [multislice[:2], multislice[2:]]
    one_slice = [device(p, 0) for p in (1, 0, 1, 0)]
    kind, groups = device_granules(one_slice)
    assert kind == "process" and groups == [one_slice[1::2], one_slice[0::2]]
    assert device_granules([device(0), device(1)])[0] == "process"  # GPUs, CPUs


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"data": 8, "dcn": "model"}, r"dcn= names \['model'\], not an axis of the mesh"),
        ({"data": 8, "dcn": {"data": 3}}, r"'data' of size 8 does not split over 3 processes"),
        ({"data": 8, "dcn": {"data": 2}}, r"spans 2 processes but the devices are on 1"),
        ({"data": 8, "dcn": {"data": 0}}, r"must be a positive int of granules"),
        ({"data": 8, "dcn": "data", "devices": ()}, "takes dcn= or devices=, not both"),
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


def test_make_mesh_rejects_a_dcn_of_another_kind():
    with pytest.raises(TypeError, match=r"pass an axis name \(dcn='data'\)"):
        meshfeed.make_mesh(data=8, dcn=["data"])  # type: ignore[arg-type]


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
