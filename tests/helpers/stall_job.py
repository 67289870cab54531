"""A job for the stall tests, run as one of 2 processes: process 1 reads its rows through a
proxy that holds every range read, process 0 through one that holds none.

``--on-stall`` and ``--stall-s`` go to ``meshfeed.initialize``; every step sums its
global batch (a collective), so process 0 waits on process 1 from its first step.
"""

import argparse
import json

import meshfeed

parser = argparse.ArgumentParser()
parser.add_argument("--url", required=True)
parser.add_argument("--options", required=True, help="storage options, JSON")
parser.add_argument("--clean", required=True, help="process 0's endpoint")
parser.add_argument("--held", required=True, help="process 1's endpoint")
parser.add_argument("--stall-s", type=float, default=3.0)
parser.add_argument("--on-stall", default="log")
args = parser.parse_args()

meshfeed.initialize(stall_s=args.stall_s, on_stall=args.on_stall)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

options = json.loads(args.options)
options["endpoint_url"] = args.held if jax.process_index() == 1 else args.clean
source = meshfeed.open_source(args.url, storage_options=options)
mesh = meshfeed.make_mesh(data=jax.device_count())
loader = meshfeed.Loader(
    source, global_batch_size=16, num_epochs=None, sharding=meshfeed.batch_sharding(mesh)
)
total = jax.jit(lambda batch: jnp.sum(batch["y"]))
for batch in loader:
    jax.block_until_ready(total(batch))
