"""The same batches through the four loading strategies, and what each costs.

A ``data=4, model=2`` mesh with the batch split over 'data' (each model pair holds the
same rows). Every strategy yields the same global arrays; they differ in what a process
reads and how the arrays are put together, which ``loader.plan`` tells before any data
moves (here on 1 process; ``meshfeed plan`` shows other process counts).

Run: ``python examples/four_strategies.py``. Prints::

    plan for global_batch_size=64 on 1 process(es); fields: image uint8[28, 28], label int64[]
    mesh axes across processes: none
    per step and per process ('x each': the same on every process; 'x/y': process 0/process 1); device<->device: all devices together

      strategy          rows read      bytes read    host->device   device<->device
     ───────────────────────────────────────────────────────────────────────────────
      global              64 each   49.5 KiB each   99.0 KiB each               0 B
      per_device         128 each   99.0 KiB each   99.0 KiB each               0 B
      per_process  <-     64 each   49.5 KiB each   99.0 KiB each               0 B
      reshard             64 each   49.5 KiB each   49.5 KiB each          49.5 KiB
    strategy='per_process' (auto would pick per_process: one process: per_process reads each row of the batch once, in one gather, and places it with one transfer per field.)
    global: 3 batches equal to per_process's: True
    per_device: 3 batches equal to per_process's: True
    per_process: 3 batches equal to per_process's: True
    reshard: 3 batches equal to per_process's: True
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np

import meshfeed

mesh = meshfeed.make_mesh(data=4, model=2)
sharding = meshfeed.batch_sharding(mesh)
rng = np.random.default_rng(0)
source = meshfeed.ArraySource(
    {"image": rng.integers(0, 256, (512, 28, 28), np.uint8), "label": np.arange(512)}
)


def batches(strategy):
    loader = meshfeed.Loader(source, global_batch_size=64, sharding=sharding, strategy=strategy)
    out = []
    for batch in loader:
        if strategy == "reshard":  # loaded split over every axis, then moved
            batch = meshfeed.reshard(batch, sharding)
        out.append({k: np.asarray(v) for k, v in batch.items()})
        if len(out) == 3:
            return loader, out
    return loader, out


loader, reference = batches("per_process")
print(meshfeed.show_plan(loader.plan), end="")
for strategy in ("global", "per_device", "per_process", "reshard"):
    _, got = batches(strategy)
    same = all(np.array_equal(g[k], r[k]) for g, r in zip(got, reference, strict=True) for k in r)
    print(f"{strategy}: 3 batches equal to per_process's: {same}")
