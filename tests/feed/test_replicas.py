import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshfeed
import multiprocess_fns
from meshfeed.testing import run_in_processes


def _sharding():
    return NamedSharding(meshfeed.make_mesh(data=4, model=2), P("data"))


def test_identical_replicas_pass_even_with_nan():
    s = _sharding()
    meshfeed.inspect.check_replicas({"x": jax.device_put(np.arange(8, dtype=np.float32), s)})
    meshfeed.inspect.check_replicas(jax.device_put(np.full(8, np.nan, np.float32), s))
    meshfeed.inspect.check_replicas({"b": jax.device_put(np.ones(8, bool), s)})


def test_differing_replicas_are_named():
    s = _sharding()
    blocks = s.addressable_devices_indices_map((8,))
    arrays = [jax.device_put(np.full(2, 7.0 if d.id == 3 else 1.0, np.float32), d) for d in blocks]
    x = jax.make_array_from_single_device_arrays((8,), s, arrays)
    with pytest.raises(ValueError, match=r"'x' block \[2:4\]: devices \[2, 3\] on processes \[0\]"):
        meshfeed.inspect.check_replicas({"x": x})


@pytest.mark.multiprocess
def test_check_every_stops_a_loader_whose_processes_disagree():
    errors = run_in_processes(multiprocess_fns.check_every_catches_disagreeing_processes)
    assert errors[0] == errors[1]
    assert errors[0].startswith("replicas differ:") and "processes [0, 1]" in errors[0]


def test_check_every_must_be_positive():
    src = meshfeed.ArraySource({"x": np.zeros(16)})
    with pytest.raises(ValueError, match="check_every=0 must be an int >= 1"):
        meshfeed.Loader(src, global_batch_size=8, sharding=_sharding(), check_every=0)
