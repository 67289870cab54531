"""Reads a meshfeed folder for two epochs with a global shuffle under a given soft
RLIMIT_NOFILE and max_open_files, and prints the batches' digest, the most descriptors
open beyond those at the start, and the steps (for test_catalog)."""

import hashlib
import json
import os
import resource
import sys

path, soft, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if soft:
    resource.setrlimit(
        resource.RLIMIT_NOFILE, (soft, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    )
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

import meshfeed  # noqa: E402

base = len(os.listdir("/proc/self/fd"))
source = meshfeed.open_source(path, max_open_files=limit or None)
loader = meshfeed.Loader(
    source,
    global_batch_size=512,
    sharding=meshfeed.batch_sharding(meshfeed.make_mesh(data=8)),
    num_epochs=2,
    shuffle=True,
    seed=1,
)
digest, most = hashlib.sha256(), 0
for batch in loader:
    digest.update(np.asarray(batch["x"]).tobytes())
    most = max(most, len(os.listdir("/proc/self/fd")) - base)
print(json.dumps({"digest": digest.hexdigest(), "most_fds": most, "steps": loader.step}))
