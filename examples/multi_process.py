"""Two processes, one mesh: run under ``meshfeed launch``.

Each process calls ``meshfeed.initialize()`` (the launcher tells it the coordinator, the
process count and its id), builds the same mesh over all 8 devices and the same loader,
and reads only the rows its 4 devices hold. A ``psum`` over the mesh checks that the two
processes assembled one global batch: the sum of the labels of the whole batch.

Run: ``python -m meshfeed launch -n 2 --devices-per-process 4 -- python
examples/multi_process.py``. Prints (process 0; process 1 stays quiet)::

    [0] processes: 2, devices: 8 (4 here)
    [0] batch: int32[32] over P('data',), this process holds rows 0..15
    [0] labels summed over the mesh: 496 (0 + 1 + ... + 31 = 496)
"""

import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshfeed

meshfeed.initialize()
import jax  # noqa: E402 -- after initialize, like any multi-process JAX program

mesh = meshfeed.make_mesh(data=jax.device_count())
source = meshfeed.ArraySource({"label": np.arange(64)})
loader = meshfeed.Loader(
    source, global_batch_size=32, sharding=meshfeed.batch_sharding(mesh), shuffle=False
)
batch = next(iter(loader))
labels = batch["label"]
rows = sorted(s.index[0].start for s in labels.addressable_shards)
total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(labels)
if jax.process_index() == 0:
    print(
        f"processes: {jax.process_count()}, devices: {jax.device_count()} "
        f"({jax.local_device_count()} here)"
    )
    print(
        f"batch: {labels.dtype}[{labels.shape[0]}] over P('data',), this process holds "
        f"rows {rows[0]}..{rows[-1] + labels.shape[0] // jax.device_count() - 1}"
    )
    total_value = int(np.asarray(total.addressable_shards[0].data))
    print(f"labels summed over the mesh: {total_value} (0 + 1 + ... + 31 = {sum(range(32))})")
