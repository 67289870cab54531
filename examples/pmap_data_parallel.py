"""Data parallelism three ways: pmap, shard_map and jit, on 8 CPU devices.

The classic pmap recipe: replicate the parameters (``in_axes=(None, 0)``), reshape the
batch to ``[devices, per_device, features]``, and each device predicts its slice. Then
the same with ``jax.shard_map`` over a mesh (no reshape: the batch is split by its
sharding) and with plain ``jax.jit`` on a sharded batch. All three give the same
predictions.

Run: ``python examples/pmap_data_parallel.py``. Prints::

    devices: 8
    pmap input: (8, 4, 3) -> output (8, 4, 2)
    shard_map output: (32, 2) PartitionSpec('data',)
    jit output: (32, 2) PartitionSpec('data',)
    pmap == shard_map == jit: True
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshfeed


def predict(params, x):
    return jnp.tanh(x @ params["w"] + params["b"])


rng = np.random.default_rng(0)
params = {"w": rng.normal(size=(3, 2)).astype(np.float32), "b": np.zeros(2, np.float32)}
batch = rng.normal(size=(32, 3)).astype(np.float32)
n = jax.device_count()
print("devices:", n)

# 1. pmap: parameters broadcast, batch reshaped to [devices, per_device, features].
per_device = batch.reshape(n, -1, batch.shape[-1])
out_pmap = jax.pmap(predict, in_axes=(None, 0))(params, per_device)
print("pmap input:", per_device.shape, "-> output", out_pmap.shape)

# 2. shard_map: the same program per device, the batch split by its sharding.
mesh = meshfeed.make_mesh(data=n)
rows = NamedSharding(mesh, P("data"))
x = jax.device_put(batch, rows)
mapped = jax.shard_map(predict, mesh=mesh, in_specs=(P(), P("data")), out_specs=P("data"))
out_shard_map = jax.jit(mapped)(params, x)
spec = out_shard_map.sharding.spec
print("shard_map output:", out_shard_map.shape, f"PartitionSpec{tuple(spec)[:1]}")

# 3. jit: write the math for the whole batch; the sharded input decides the layout.
out_jit = jax.jit(predict)(params, x)
print("jit output:", out_jit.shape, f"PartitionSpec{tuple(out_jit.sharding.spec)[:1]}")

same = np.allclose(out_pmap.reshape(32, 2), out_shard_map, atol=1e-6) and np.allclose(
    out_shard_map, out_jit, atol=1e-6
)
print("pmap == shard_map == jit:", same)
