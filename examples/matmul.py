"""Sharded matrix multiplication: every ``meshfeed.ops.matmul`` strategy on 8 devices.

Each strategy places ``a`` [64, 32] and ``b`` [32, 48] its way on a ``data=4, model=2``
mesh, runs one ``shard_map`` (or lets ``jit`` decide, for ``auto``) and returns
``a @ b`` in its own layout; the bytes its collectives move are the price of that
layout. ``meshfeed bench matmul --size 4096`` times them.

Run: ``python examples/matmul.py``. Prints::

    strategy        product layout             bytes moved  equals a @ b
    replicated      P()                                  0  True
    rows            P(('data', 'model'),)                0  True
    allgather       P()                             100352  True
    reduce_scatter  P(('data', 'model'),)            86016  True
    2d              P('data', 'model')               26624  True
    auto            P('data', 'model')        XLA's choice  True
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np

import meshfeed
from meshfeed import ops

mesh = meshfeed.make_mesh(data=4, model=2)
rng = np.random.default_rng(0)
a = rng.normal(size=(64, 32)).astype(np.float32)
b = rng.normal(size=(32, 48)).astype(np.float32)
want = a @ b


def spec(sharding):
    entries = list(sharding.spec)
    while entries and entries[-1] is None:
        entries.pop()
    return "P(" + ", ".join(repr(e) for e in entries) + ("," if len(entries) == 1 else "") + ")"


print(f"{'strategy':<16}{'product layout':<24}{'bytes moved':>14}  equals a @ b")
for strategy in ops.MATMUL_STRATEGIES:
    c = ops.matmul(a, b, mesh=mesh, strategy=strategy)
    moved = ops.bytes_moved(mesh, strategy, 64, 32, 48, 4)
    shown = "XLA's choice" if moved < 0 else str(moved)
    ok = bool(np.allclose(np.asarray(c), want, rtol=1e-5, atol=1e-5))
    print(f"{strategy:<16}{spec(c.sharding):<24}{shown:>14}  {ok}")
