"""A finished job for the shutdown tests, run as one of 2 processes; one leaves early.

Started as a cluster manager starts a job (coordinator, count and id in the environment,
``meshfeed.initialize()`` reads them). Both processes agree on one sum across processes
(the run); then process ``--leaver`` ends with ``os._exit(0)`` at once -- after
``meshfeed.shutdown()`` with ``--shutdown`` -- while the other computes on its own
devices for ``--stay`` seconds more and returns normally (or, with ``--die``, kills
itself: lost while the leaver waits in ``meshfeed.shutdown()``).
"""

import argparse
import os
import signal
import time

import meshfeed

parser = argparse.ArgumentParser()
parser.add_argument("--leaver", type=int, default=1)
parser.add_argument("--shutdown", action="store_true")
parser.add_argument("--stay", type=float, default=2.0)
parser.add_argument("--die", action="store_true")
args = parser.parse_args()

meshfeed.initialize(heartbeat_timeout=4.0)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

here = jax.process_index()
total = multihost_utils.process_allgather(np.array([here + 1])).sum()
print(f"process {here}: the run's sum is {total}", flush=True)

if here == args.leaver:
    if args.shutdown:
        meshfeed.shutdown()
        meshfeed.shutdown()  # a second call does nothing
    print(f"process {here}: leaving with os._exit(0)", flush=True)
    os._exit(0)

end = time.monotonic() + args.stay
x = jnp.ones((64, 64))
while time.monotonic() < end:  # work of this process alone, on its own devices
    x = (x @ x) / 64
    x.block_until_ready()
    time.sleep(0.05)
if args.die:
    os.kill(os.getpid(), signal.SIGKILL)
print(f"process {here}: done", flush=True)
