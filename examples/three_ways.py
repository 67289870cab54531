"""One sigmoid layer, three ways to run it over a mesh: the results are equal.

1. ``jax.jit`` over sharded inputs: the batch is split over 'data', the weights over
   'model'; XLA propagates the layouts and inserts the communication.
2. ``jax.lax.with_sharding_constraint`` inside ``jit``: the same computation with the
   output's layout pinned.
3. ``jax.shard_map`` + ``psum``: each device multiplies its block of inputs (features
   split over 'model') by its rows of weights, and a ``psum`` over 'model' adds the
   partial sums, written by hand.

Run: ``python examples/three_ways.py``. Prints::

    x: float32[16, 8]  P('data', 'model') on mesh data=4 x model=2
    w: float32[8, 4]  P('model', None) on mesh data=4 x model=2
    1. jit: P('data',)
    2. with_sharding_constraint: P('data', 'model')
    3. shard_map + psum: P('data',)
    equal: True
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshfeed

mesh = meshfeed.make_mesh(data=4, model=2)
rng = np.random.default_rng(0)
x = jax.device_put(
    rng.normal(size=(16, 8)).astype(np.float32), NamedSharding(mesh, P("data", "model"))
)
w = jax.device_put(
    rng.normal(size=(8, 4)).astype(np.float32), NamedSharding(mesh, P("model", None))
)
print("x:", meshfeed.show_sharding(x, quiet=True).splitlines()[0])
print("w:", meshfeed.show_sharding(w, quiet=True).splitlines()[0])


def layer(x, w):
    return jax.nn.sigmoid(x @ w)


def spec(a):
    entries = list(a.sharding.spec)
    while entries and entries[-1] is None:
        entries.pop()
    return "P(" + ", ".join(repr(e) for e in entries) + ("," if len(entries) == 1 else "") + ")"


one = jax.jit(layer)(x, w)
print("1. jit:", spec(one))

pinned = NamedSharding(mesh, P("data", "model"))
two = jax.jit(lambda x, w: jax.lax.with_sharding_constraint(layer(x, w), pinned))(x, w)
print("2. with_sharding_constraint:", spec(two))


def local(x_block, w_rows):  # x: [16/4, 8/2], w: [8/2, 4]
    return jax.nn.sigmoid(jax.lax.psum(x_block @ w_rows, "model"))


three = jax.jit(
    jax.shard_map(
        local, mesh=mesh, in_specs=(P("data", "model"), P("model", None)), out_specs=P("data")
    )
)(x, w)
print("3. shard_map + psum:", spec(three))
print("equal:", bool(np.allclose(one, two, atol=1e-6) and np.allclose(one, three, atol=1e-6)))
